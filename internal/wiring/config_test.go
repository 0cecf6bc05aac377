package wiring

import (
	"strings"
	"testing"
	"time"
)

func TestConfigFromEnv(t *testing.T) {
	env := map[string]string{
		"FLASHSALE_CAPACITY_FACTOR":       "1.5",
		"FLASHSALE_WAITING_PUSHES":        "-1",
		"FLASHSALE_STATUS_EVERY":          "5s",
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
	if c.CapacityFactor != 1.5 || c.WaitingPushes != -1 || c.StatusEvery != 5*time.Second ||
		c.AdmissionTTL != 30*time.Second || c.DBMaxConns != 32 || c.DBMinConns != 12 || c.KafkaProducers != 2 ||
		c.WriterInFlight != 3 || c.WSMaxConnsPerAddr != 5000 {
		t.Errorf("got %+v", c)
	}
	for name, bad := range map[string]string{
		"FLASHSALE_WAITING_PUSHES":           "-2",
		"FLASHSALE_STATUS_EVERY":             "soon",
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
