package wiring

import (
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/waitroom"
)

func TestConfigFromEnv(t *testing.T) {
	env := map[string]string{
		"FLASHSALE_CAPACITY_FACTOR":       "1.5",
		"FLASHSALE_ADMISSION_TTL":         "30s",
		"FLASHSALE_DB_MAX_CONNS":          "32",
		"FLASHSALE_DB_MIN_CONNS":          "12",
		"FLASHSALE_KAFKA_PRODUCERS":       "2",
		"FLASHSALE_WRITER_IN_FLIGHT":      "3",
		"FLASHSALE_WS_MAX_CONNS_PER_ADDR": "5000",
	}
	c := Defaults()
	if err := c.FromEnv(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if c.CapacityFactor != 1.5 ||
		c.AdmissionTTL != 30*time.Second || c.DBMaxConns != 32 || c.DBMinConns != 12 || c.KafkaProducers != 2 ||
		c.WriterInFlight != 3 || c.WSMaxConnsPerAddr != 5000 {
		t.Errorf("got %+v", c)
	}
	for name, bad := range map[string]string{
		"FLASHSALE_CAPACITY_FACTOR":          "0",
		"FLASHSALE_DB_MAX_CONNS":             "many",
		"FLASHSALE_DB_MIN_CONNS":             "0",
		"FLASHSALE_KAFKA_PRODUCERS":          "none",
		"FLASHSALE_WRITER_IN_FLIGHT":         "-1",
		"FLASHSALE_WS_MAX_CONNS_PER_ADDR":    "0",
		"FLASHSALE_KAFKA_TLS":                "yes please",
		"FLASHSALE_KAFKA_PARTITIONS":         "0",
		"FLASHSALE_KAFKA_REPLICATION_FACTOR": "40000",
	} {
		c := Defaults()
		err := c.FromEnv(func(k string) string {
			if k == name {
				return bad
			}
			return ""
		})
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=%q: err %v, want one naming the variable", name, bad, err)
		}
	}
}

// FLASHSALE_DRAW_LEAD: 3s by default, 0 draws at the opening, a negative
// or malformed value is refused naming the variable.
func TestDrawLeadFromEnv(t *testing.T) {
	if c := Defaults(); c.DrawLead != 3*time.Second {
		t.Fatalf("default draw lead %v, want 3s", c.DrawLead)
	}
	for v, want := range map[string]time.Duration{"0": 0, "5s": 5 * time.Second, "250ms": 250 * time.Millisecond} {
		c := Defaults()
		if err := c.FromEnv(func(k string) string { return map[string]string{"FLASHSALE_DRAW_LEAD": v}[k] }); err != nil || c.DrawLead != want {
			t.Errorf("FLASHSALE_DRAW_LEAD=%q: %v, %v; want %v", v, c.DrawLead, err, want)
		}
	}
	for _, bad := range []string{"-1s", "soon", "3"} {
		c := Defaults()
		err := c.FromEnv(func(k string) string { return map[string]string{"FLASHSALE_DRAW_LEAD": bad}[k] })
		if err == nil || !strings.Contains(err.Error(), "FLASHSALE_DRAW_LEAD") {
			t.Errorf("FLASHSALE_DRAW_LEAD=%q: err %v, want one naming the variable", bad, err)
		}
	}
}

// FLASHSALE_OPENING_HOLD: unset is waitroom's default, 0 turns the
// hold off, a negative or malformed value is refused naming the variable.
func TestOpeningHoldFromEnv(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string { return map[string]string{"FLASHSALE_OPENING_HOLD": v}[k] }
	}
	for v, want := range map[string]time.Duration{"": waitroom.DefaultOpeningHold, "0": -1, "0s": -1, "1500ms": 1500 * time.Millisecond} {
		c := Defaults()
		if err := c.FromEnv(env(v)); err != nil || c.OpeningHold != want {
			t.Errorf("FLASHSALE_OPENING_HOLD=%q: %v, %v; want %v", v, c.OpeningHold, err, want)
		}
	}
	for _, bad := range []string{"-1s", "later", "3"} {
		c := Defaults()
		if err := c.FromEnv(env(bad)); err == nil || !strings.Contains(err.Error(), "FLASHSALE_OPENING_HOLD") {
			t.Errorf("FLASHSALE_OPENING_HOLD=%q: err %v, want one naming the variable", bad, err)
		}
	}
}

// FLASHSALE_QUEUE_KEY_TTL: unset is the room's default, 0 keeps the keys
// (the room's negative), a negative or malformed value is refused naming
// the variable.
func TestQueueKeyTTLFromEnv(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string { return map[string]string{"FLASHSALE_QUEUE_KEY_TTL": v}[k] }
	}
	for v, want := range map[string]time.Duration{"": waitroom.DefaultQueueKeyTTL, "0": -1, "72h": 72 * time.Hour} {
		c := Defaults()
		if err := c.FromEnv(env(v)); err != nil || queueKeyTTL(c.QueueKeyTTL) != want {
			t.Errorf("FLASHSALE_QUEUE_KEY_TTL=%q: %v, %v; want %v", v, queueKeyTTL(c.QueueKeyTTL), err, want)
		}
	}
	for _, bad := range []string{"-1h", "forever", "3"} {
		c := Defaults()
		if err := c.FromEnv(env(bad)); err == nil || !strings.Contains(err.Error(), "FLASHSALE_QUEUE_KEY_TTL") {
			t.Errorf("FLASHSALE_QUEUE_KEY_TTL=%q: err %v, want one naming the variable", bad, err)
		}
	}
}

// FLASHSALE_CLOCK_SKEW takes a signed duration; FLASHSALE_CLOCK_MAX_OFFSET
// a positive one. A malformed value is refused naming the variable.
func TestClockFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name, v string
		skew    time.Duration
		maxOff  time.Duration
		bad     bool
	}{
		{"FLASHSALE_CLOCK_SKEW", "", 0, 500 * time.Millisecond, false},
		{"FLASHSALE_CLOCK_SKEW", "2s", 2 * time.Second, 500 * time.Millisecond, false},
		{"FLASHSALE_CLOCK_SKEW", "-1500ms", -1500 * time.Millisecond, 500 * time.Millisecond, false},
		{"FLASHSALE_CLOCK_SKEW", "fast", 0, 0, true},
		{"FLASHSALE_CLOCK_MAX_OFFSET", "1s", 0, time.Second, false},
		{"FLASHSALE_CLOCK_MAX_OFFSET", "-1s", 0, 0, true},
	} {
		c := Defaults()
		err := c.FromEnv(func(k string) string { return map[string]string{tc.name: tc.v}[k] })
		switch {
		case tc.bad && (err == nil || !strings.Contains(err.Error(), tc.name)):
			t.Errorf("%s=%q: err %v, want one naming the variable", tc.name, tc.v, err)
		case !tc.bad && (err != nil || c.ClockSkew != tc.skew || c.ClockMaxOffset != tc.maxOff):
			t.Errorf("%s=%q: skew %s, max offset %s, err %v; want %s, %s", tc.name, tc.v, c.ClockSkew, c.ClockMaxOffset, err, tc.skew, tc.maxOff)
		}
	}
}
