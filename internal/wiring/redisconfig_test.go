package wiring

import (
	"strings"
	"testing"
)

// TestRedisSettingsFromEnv: the Redis topology variables reach the
// configuration, and a start with none, two, or a Sentinel without its
// master is refused naming the variables.
func TestRedisSettingsFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string // "" when valid
	}{
		{"url", map[string]string{"FLASHSALE_REDIS_URL": "redis://h:1/0"}, ""},
		{"cluster", map[string]string{"FLASHSALE_REDIS_CLUSTER": "a:1, b:2,c:3"}, ""},
		{"sentinel", map[string]string{"FLASHSALE_REDIS_SENTINELS": "s:26379", "FLASHSALE_REDIS_MASTER": "fs", "FLASHSALE_REDIS_PASSWORD": "p"}, ""},
		{"none", map[string]string{}, "Redis is not configured"},
		{"two", map[string]string{"FLASHSALE_REDIS_URL": "redis://h:1/0", "FLASHSALE_REDIS_CLUSTER": "a:1"}, "choose one Redis topology"},
		{"bad seed", map[string]string{"FLASHSALE_REDIS_CLUSTER": "a:1,b"}, `FLASHSALE_REDIS_CLUSTER: "b" is not host:port`},
		{"no master", map[string]string{"FLASHSALE_REDIS_SENTINELS": "s:26379"}, "FLASHSALE_REDIS_MASTER"},
		{"unreadable CA", map[string]string{"FLASHSALE_REDIS_CLUSTER": "a:1", "FLASHSALE_REDIS_TLS_CA": "/nonexistent/ca.pem"}, "FLASHSALE_REDIS_TLS_CA"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.env["FLASHSALE_DATABASE_URL"] = "postgres://x"
			tc.env["FLASHSALE_JWT_SECRET"] = testSecret
			c := Defaults()
			if err := c.FromEnv(func(k string) string { return tc.env[k] }); err != nil {
				t.Fatal(err)
			}
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate = %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want an error with %q", err, tc.want)
			}
		})
	}
	c := Defaults()
	env := map[string]string{"FLASHSALE_REDIS_CLUSTER": "a:1, b:2", "FLASHSALE_REDIS_TLS_CA": "ca.pem", "FLASHSALE_REDIS_PASSWORD": "pw"}
	if err := c.FromEnv(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	r := c.Redis()
	if strings.Join(r.Cluster, ",") != "a:1,b:2" || r.TLSCA != "ca.pem" || r.Password != "pw" {
		t.Fatalf("Redis() = %+v", r)
	}
}
