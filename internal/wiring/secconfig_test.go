package wiring

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashsale/flashsale/internal/adapter/kafka"
)

func TestKafkaAndJWKSFromEnv(t *testing.T) {
	env := map[string]string{
		"FLASHSALE_KAFKA_BROKERS":            "k1:9093,k2:9093",
		"FLASHSALE_KAFKA_TLS":                "1",
		"FLASHSALE_KAFKA_TLS_CA":             "/etc/kafka/ca.pem",
		"FLASHSALE_KAFKA_TLS_CERT":           "/etc/kafka/client.pem",
		"FLASHSALE_KAFKA_TLS_KEY":            "/etc/kafka/client-key.pem",
		"FLASHSALE_KAFKA_SASL_MECHANISM":     "SCRAM-SHA-512",
		"FLASHSALE_KAFKA_USERNAME":           "flashsale",
		"FLASHSALE_KAFKA_PASSWORD":           "pw",
		"FLASHSALE_KAFKA_PARTITIONS":         "24",
		"FLASHSALE_KAFKA_REPLICATION_FACTOR": "3",
		"FLASHSALE_JWT_JWKS_URL":             "https://idp.example.com/.well-known/jwks.json",
		"FLASHSALE_JWT_ISSUER":               "https://idp.example.com/",
		"FLASHSALE_JWT_AUDIENCE":             "flashsale",
	}
	c := Defaults()
	if err := c.FromEnv(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	want := kafka.Security{TLS: true, CAFile: "/etc/kafka/ca.pem", CertFile: "/etc/kafka/client.pem", KeyFile: "/etc/kafka/client-key.pem",
		SASLMechanism: "SCRAM-SHA-512", Username: "flashsale", Password: "pw"}
	if c.KafkaSecurity != want {
		t.Errorf("KafkaSecurity = %#v, want %#v", c.KafkaSecurity, want)
	}
	if c.KafkaTopics != (kafka.TopicSettings{Partitions: 24, ReplicationFactor: 3}) {
		t.Errorf("KafkaTopics = %+v", c.KafkaTopics)
	}
	if c.JWTJWKSURL != env["FLASHSALE_JWT_JWKS_URL"] || c.JWTIssuer != env["FLASHSALE_JWT_ISSUER"] || c.JWTAudience != "flashsale" {
		t.Errorf("JWKS settings = %q %q %q", c.JWTJWKSURL, c.JWTIssuer, c.JWTAudience)
	}
}

func TestKafkaAndJWKSValidate(t *testing.T) {
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := func() Config {
		c := Defaults()
		c.RedisURL, c.DatabaseURL, c.JWTSecret = "redis://r", "postgres://p", testSecret
		c.KafkaBrokers = []string{"k:9093"}
		return c
	}
	tests := []struct {
		name   string
		mutate func(*Config)
		want   string // in the error
	}{
		{"unknown mechanism", func(c *Config) {
			c.KafkaSecurity = kafka.Security{SASLMechanism: "OAUTHBEARER", Username: "u", Password: "p"}
		}, "OAUTHBEARER"},
		{"SASL without a password", func(c *Config) { c.KafkaSecurity = kafka.Security{SASLMechanism: "PLAIN", Username: "u"} }, "password"},
		{"unreadable CA", func(c *Config) { c.KafkaSecurity = kafka.Security{TLS: true, CAFile: "/nonexistent/ca.pem"} }, "/nonexistent/ca.pem"},
		{"CA not PEM", func(c *Config) { c.KafkaSecurity = kafka.Security{TLS: true, CAFile: ca} }, "no PEM certificate"},
		{"cert without key", func(c *Config) { c.KafkaSecurity = kafka.Security{TLS: true, CertFile: ca} }, "both or neither"},
		{"TLS to the embedded broker", func(c *Config) { c.KafkaBrokers, c.KafkaSecurity = nil, kafka.Security{TLS: true} }, "FLASHSALE_KAFKA_BROKERS"},
		{"issuer without keys", func(c *Config) { c.JWTIssuer = "https://idp" }, "FLASHSALE_JWT_JWKS_URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := base()
			tt.mutate(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate: %v; want an error naming %s", err, tt.want)
			}
		})
	}
	c := base()
	c.KafkaSecurity = kafka.Security{TLS: true, SASLMechanism: "SCRAM-SHA-256", Username: "u", Password: "p"}
	c.JWTJWKSURL, c.JWTIssuer = "https://idp/jwks", "https://idp"
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate of a good configuration: %v", err)
	}
}
