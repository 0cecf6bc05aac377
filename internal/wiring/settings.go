package wiring

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/flashsale/flashsale/auth"
)

// Setting is one operator setting: its environment variable, its flag,
// its default, its bounds, what it means and which roles read it. The
// spec (Settings) is the one place a setting is declared: FromEnv parses
// and checks the environment with it, RegisterFlags makes the commands'
// flags from it, WriteSettings prints the effective settings
// (`flashsale config`) and SettingsMarkdown the README's table (a test
// keeps the README current). docs/CONFIGURATION.md explains each in full.
type Setting struct {
	Name    string // the environment variable
	Flag    string // the flag of the commands that take it; empty: none
	Default string // as the README shows it
	Bounds  string // what a value must be; empty: any
	Meaning string // one short line
	Roles   string // the roles and commands that read it
	// Secret settings are redacted by `flashsale config` and have no flag,
	// so that they never show in a process list.
	Secret bool

	parse func(c *Config, v string) error // v is not empty; the error says what is wanted
	show  func(c *Config) string
}

// The roles of the Roles column. dev runs every serving role in one
// process and reads what they read; token, migrate and verify-draw are
// flashsale's tools, load and bench the flashsale-load and flashsale-bench
// binaries.
const (
	serving  = "gateway, writer, expiry"
	gwOnly   = "gateway"
	anyRole  = "gateway, writer, expiry, broker"
	devBroke = "dev, broker"
)

// binding is how a setting reads into and shows from a Config.
type binding struct {
	parse func(c *Config, v string) error
	show  func(c *Config) string
}

func bind(s Setting, b binding) Setting {
	s.parse, s.show = b.parse, b.show
	return s
}

func str(f func(*Config) *string) binding {
	return binding{
		parse: func(c *Config, v string) error { *f(c) = v; return nil },
		show:  func(c *Config) string { return *f(c) },
	}
}

// urlStr is a string setting whose user password is hidden when shown.
func urlStr(f func(*Config) *string) binding {
	b := str(f)
	b.show = func(c *Config) string {
		v := *f(c)
		if u, err := url.Parse(v); err == nil && u.User != nil {
			return u.Redacted()
		}
		return v
	}
	return b
}

func list(f func(*Config) *[]string) binding {
	return binding{
		parse: func(c *Config, v string) error { *f(c) = splitList(v); return nil },
		show:  func(c *Config) string { return strings.Join(*f(c), ",") },
	}
}

func showDur(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	return d.String()
}

// duration reads a duration within [lo, hi] (hi 0: no upper bound).
func duration(f func(*Config) *time.Duration, lo, hi time.Duration, want string) binding {
	return binding{
		parse: func(c *Config, v string) error {
			d, err := time.ParseDuration(v)
			if v == "0" {
				d, err = 0, nil
			}
			if err != nil || d < lo || (hi > 0 && d > hi) {
				return errors.New(want)
			}
			*f(c) = d
			return nil
		},
		show: func(c *Config) string { return showDur(*f(c)) },
	}
}

// tierSigners reads a list of the signers auth.ParseTierSigners knows.
func tierSigners(f func(*Config) *[]string) binding {
	b := list(f)
	b.parse = func(c *Config, v string) error {
		l := splitList(v)
		if _, err := auth.ParseTierSigners(l); err != nil {
			return errors.New("a comma-separated list of secret, public-keys and jwks (or none)")
		}
		*f(c) = l
		return nil
	}
	return b
}

// positiveDur reads a duration greater than zero.
func positiveDur(f func(*Config) *time.Duration) binding {
	return duration(f, time.Nanosecond, 0, "a positive duration like 30s or 10m")
}

// integer reads an integer within [lo, hi] into an int, int32 or int16.
func integer[T int | int32 | int16](f func(*Config) *T, lo, hi int64, want string) binding {
	return binding{
		parse: func(c *Config, v string) error {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < lo || n > hi {
				return errors.New(want)
			}
			*f(c) = T(n)
			return nil
		},
		show: func(c *Config) string {
			if *f(c) == 0 && lo > 0 {
				return "" // unset: the component's default
			}
			return strconv.FormatInt(int64(*f(c)), 10)
		},
	}
}

func positive[T int | int32 | int16](f func(*Config) *T) binding {
	var zero T
	hi := int64(1<<31 - 1)
	switch any(zero).(type) {
	case int16:
		hi = 1<<15 - 1
	}
	return integer(f, 1, hi, "a positive integer")
}

// Settings is the configuration spec: every operator setting, in the
// README's order.
func Settings() []Setting {
	return []Setting{
		bind(Setting{Name: "FLASHSALE_HTTP_ADDR", Flag: "http-addr", Default: "`127.0.0.1:8080`", Roles: gwOnly,
			Meaning: "public listener (API, waiting room, static pages)"},
			str(func(c *Config) *string { return &c.HTTPAddr })),
		bind(Setting{Name: "FLASHSALE_ADMIN_ADDR", Flag: "admin-addr", Default: "`127.0.0.1:9090`", Roles: serving,
			Meaning: "`/metrics`, `/healthz`, `/readyz`, pprof"},
			str(func(c *Config) *string { return &c.AdminAddr })),
		bind(Setting{Name: "FLASHSALE_REDIS_URL", Flag: "redis-url", Default: "dev: a local one", Roles: serving + ", verify-draw, load",
			Meaning: "one Redis node: `redis://[user:password@]host:port/db`, `rediss://` for TLS"},
			urlStr(func(c *Config) *string { return &c.RedisURL })),
		bind(Setting{Name: "FLASHSALE_REDIS_CLUSTER", Flag: "redis-cluster", Roles: serving + ", verify-draw, load",
			Meaning: "`host:port` seeds of a Redis Cluster, comma-separated"},
			list(func(c *Config) *[]string { return &c.RedisCluster })),
		bind(Setting{Name: "FLASHSALE_REDIS_SENTINELS", Flag: "redis-sentinels", Roles: serving + ", verify-draw, load",
			Meaning: "`host:port` of Redis Sentinels, comma-separated"},
			list(func(c *Config) *[]string { return &c.RedisSentinels })),
		bind(Setting{Name: "FLASHSALE_REDIS_MASTER", Flag: "redis-master", Roles: serving + ", verify-draw, load",
			Meaning: "the master's name the Sentinels monitor"},
			str(func(c *Config) *string { return &c.RedisMaster })),
		bind(Setting{Name: "FLASHSALE_REDIS_PASSWORD", Roles: serving + ", verify-draw, load", Secret: true,
			Meaning: "password of the Redis nodes (any topology)"},
			str(func(c *Config) *string { return &c.RedisPassword })),
		bind(Setting{Name: "FLASHSALE_REDIS_TLS_CA", Flag: "redis-tls-ca", Roles: serving + ", verify-draw, load",
			Meaning: "PEM file of the CA of the Redis nodes' certificates"},
			str(func(c *Config) *string { return &c.RedisTLSCA })),
		bind(Setting{Name: "FLASHSALE_DATABASE_URL", Flag: "database-url", Default: "dev: a local one", Roles: serving + ", migrate, verify-draw, load",
			Meaning: "`postgres://...`"},
			urlStr(func(c *Config) *string { return &c.DatabaseURL })),
		bind(Setting{Name: "FLASHSALE_KAFKA_BROKERS", Flag: "kafka-brokers", Default: "dev: embedded broker", Roles: serving,
			Meaning: "seed brokers, comma-separated"},
			list(func(c *Config) *[]string { return &c.KafkaBrokers })),
		bind(Setting{Name: "FLASHSALE_KAFKA_PORT", Flag: "kafka-port", Default: "any free port (broker: `9092`)", Bounds: "0–65535", Roles: devBroke,
			Meaning: "port of the embedded broker (broker: `--port`)"},
			integer(func(c *Config) *int { return &c.KafkaPort }, 0, 65535, "a port number")),
		bind(Setting{Name: "FLASHSALE_KAFKA_HOST", Default: "`127.0.0.1`", Roles: "broker",
			Meaning: "`flashsale broker`: listen and advertised address (`--host`)"},
			str(func(c *Config) *string { return &c.KafkaHost })),
		bind(Setting{Name: "FLASHSALE_KAFKA_DATA_DIR", Flag: "kafka-data-dir", Default: "`.flashsale/kafka`", Roles: devBroke,
			Meaning: "where the embedded broker keeps its data (broker: `--data-dir`)"},
			str(func(c *Config) *string { return &c.KafkaDataDir })),
		bind(Setting{Name: "FLASHSALE_KAFKA_TLS", Default: "`0`", Bounds: "`0` or `1`", Roles: serving,
			Meaning: "`1`: TLS to the configured brokers"},
			binding{
				parse: func(c *Config, v string) error {
					on, err := strconv.ParseBool(v)
					if err != nil {
						return errors.New("1 or 0")
					}
					c.KafkaSecurity.TLS = on
					return nil
				},
				show: func(c *Config) string { return map[bool]string{true: "1", false: "0"}[c.KafkaSecurity.TLS] },
			}),
		bind(Setting{Name: "FLASHSALE_KAFKA_TLS_CA", Default: "system roots", Roles: serving,
			Meaning: "PEM file of the brokers' CAs"},
			str(func(c *Config) *string { return &c.KafkaSecurity.CAFile })),
		bind(Setting{Name: "FLASHSALE_KAFKA_TLS_CERT", Roles: serving,
			Meaning: "PEM client certificate, with the key"},
			str(func(c *Config) *string { return &c.KafkaSecurity.CertFile })),
		bind(Setting{Name: "FLASHSALE_KAFKA_TLS_KEY", Roles: serving,
			Meaning: "PEM client key, with the certificate"},
			str(func(c *Config) *string { return &c.KafkaSecurity.KeyFile })),
		bind(Setting{Name: "FLASHSALE_KAFKA_SASL_MECHANISM", Default: "no SASL", Bounds: "`PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`", Roles: serving,
			Meaning: "SASL mechanism to the brokers"},
			str(func(c *Config) *string { return &c.KafkaSecurity.SASLMechanism })),
		bind(Setting{Name: "FLASHSALE_KAFKA_USERNAME", Roles: serving,
			Meaning: "SASL user"},
			str(func(c *Config) *string { return &c.KafkaSecurity.Username })),
		bind(Setting{Name: "FLASHSALE_KAFKA_PASSWORD", Roles: serving, Secret: true,
			Meaning: "SASL password"},
			str(func(c *Config) *string { return &c.KafkaSecurity.Password })),
		bind(Setting{Name: "FLASHSALE_KAFKA_PARTITIONS", Default: "`8`", Bounds: "> 0", Roles: serving,
			Meaning: "partitions of the topics flashsale creates"},
			positive(func(c *Config) *int32 { return &c.KafkaTopics.Partitions })),
		bind(Setting{Name: "FLASHSALE_KAFKA_REPLICATION_FACTOR", Default: "broker default", Bounds: "> 0", Roles: serving,
			Meaning: "replicas of the topics flashsale creates"},
			positive(func(c *Config) *int16 { return &c.KafkaTopics.ReplicationFactor })),
		bind(Setting{Name: "FLASHSALE_JWT_SECRET", Default: "dev: random", Bounds: "≥ 32 bytes", Roles: gwOnly + ", token, load, bench", Secret: true,
			Meaning: "HS256 key of access tokens"},
			str(func(c *Config) *string { return &c.JWTSecret })),
		bind(Setting{Name: "FLASHSALE_JWT_PUBLIC_KEYS", Roles: gwOnly,
			Meaning: "PEM files of public keys also accepted, comma-separated"},
			list(func(c *Config) *[]string { return &c.JWTPublicKeys })),
		bind(Setting{Name: "FLASHSALE_JWT_JWKS_URL", Roles: gwOnly,
			Meaning: "an identity provider's JWK Set, whose keys are also accepted"},
			str(func(c *Config) *string { return &c.JWTJWKSURL })),
		bind(Setting{Name: "FLASHSALE_JWT_ISSUER", Roles: gwOnly,
			Meaning: "required `iss` of tokens of a public key"},
			str(func(c *Config) *string { return &c.JWTIssuer })),
		bind(Setting{Name: "FLASHSALE_JWT_AUDIENCE", Roles: gwOnly,
			Meaning: "required `aud` of tokens of a public key"},
			str(func(c *Config) *string { return &c.JWTAudience })),
		bind(Setting{Name: "FLASHSALE_JWT_TIER_SIGNERS", Default: "none", Bounds: "`secret`, `public-keys`, `jwks`", Roles: gwOnly,
			Meaning: "signers whose `tier` claim a sale's access rule believes, comma-separated"},
			tierSigners(func(c *Config) *[]string { return &c.JWTTierSigners })),
		bind(Setting{Name: "FLASHSALE_JWT_MAX_LIFETIME", Default: "`24h`", Bounds: "> 0", Roles: gwOnly,
			Meaning: "longest access-token lifetime accepted"},
			positiveDur(func(c *Config) *time.Duration { return &c.JWTMaxLifetime })),
		bind(Setting{Name: "FLASHSALE_ADMISSION_KEY", Default: "derived from the JWT secret", Bounds: "≥ 32 bytes", Roles: gwOnly, Secret: true,
			Meaning: "HMAC key of admission tokens, the same on every gateway"},
			str(func(c *Config) *string { return &c.AdmissionKey })),
		bind(Setting{Name: "FLASHSALE_PAYMENT_WINDOW", Flag: "payment-window", Default: "`10m`", Bounds: "> 0", Roles: "gateway, expiry",
			Meaning: "how long a reserved order may stay unpaid"},
			positiveDur(func(c *Config) *time.Duration { return &c.PaymentWindow })),
		bind(Setting{Name: "FLASHSALE_EXPIRY_INTERVAL", Flag: "expiry-interval", Default: "`30s`", Bounds: "> 0", Roles: "expiry",
			Meaning: "how often the expiry worker scans"},
			positiveDur(func(c *Config) *time.Duration { return &c.ExpiryInterval })),
		bind(Setting{Name: "FLASHSALE_PAYMENT_SECRET", Default: "callback off", Bounds: "≥ 32 bytes", Roles: gwOnly, Secret: true,
			Meaning: "HMAC key of the payment provider's callbacks"},
			str(func(c *Config) *string { return &c.PaymentSecret })),
		bind(Setting{Name: "FLASHSALE_PAYMENT_URL", Default: "the simulated pay", Bounds: "http(s) URL with `{orderId}`", Roles: gwOnly,
			Meaning: "the shop's payment page"},
			binding{
				parse: func(c *Config, v string) error {
					if err := checkPaymentURL(v); err != nil {
						return err
					}
					c.PaymentURL = v
					return nil
				},
				show: func(c *Config) string { return c.PaymentURL },
			}),
		bind(Setting{Name: "FLASHSALE_WEBHOOK_URL", Default: "no webhook", Roles: "gateway, expiry",
			Meaning: "the shop's endpoint for signed order and shopper events"},
			str(func(c *Config) *string { return &c.WebhookURL })),
		bind(Setting{Name: "FLASHSALE_WEBHOOK_SECRET", Bounds: "≥ 32 bytes", Roles: "gateway, expiry", Secret: true,
			Meaning: "HMAC key of the webhook's signature"},
			str(func(c *Config) *string { return &c.WebhookSecret })),
		bind(Setting{Name: "FLASHSALE_WEBHOOK_MAX_ATTEMPTS", Default: "`10`", Bounds: "> 0", Roles: "expiry",
			Meaning: "failed attempts before an event goes to the dead letters"},
			positive(func(c *Config) *int { return &c.WebhookMaxAttempts })),
		bind(Setting{Name: "FLASHSALE_PUSH_VAPID_PUBLIC_KEY", Default: "notifications off", Bounds: "base64url P-256 point", Roles: gwOnly,
			Meaning: "VAPID public key of the turn notifications (Web Push)"},
			str(func(c *Config) *string { return &c.PushPublicKey })),
		bind(Setting{Name: "FLASHSALE_PUSH_VAPID_PRIVATE_KEY", Bounds: "its base64url private key", Roles: gwOnly, Secret: true,
			Meaning: "VAPID private key, the same on every gateway"},
			str(func(c *Config) *string { return &c.PushPrivateKey })),
		bind(Setting{Name: "FLASHSALE_PUSH_SUBJECT", Bounds: "mailto: or https:// URL", Roles: gwOnly,
			Meaning: "the operator's contact the push services see; required with the keys"},
			str(func(c *Config) *string { return &c.PushSubject })),
		bind(Setting{Name: "FLASHSALE_PUSH_INSECURE_HOSTS", Roles: gwOnly,
			Meaning: "push endpoint hosts allowed over http and at private addresses, comma-separated"},
			str(func(c *Config) *string { return &c.PushInsecureHosts })),
		bind(Setting{Name: "FLASHSALE_ADMISSION_TTL", Flag: "admission-ttl", Default: "`5m`", Bounds: "> 0", Roles: gwOnly,
			Meaning: "lifetime of an admission token"},
			positiveDur(func(c *Config) *time.Duration { return &c.AdmissionTTL })),
		bind(Setting{Name: "FLASHSALE_TRUSTED_PROXIES", Roles: gwOnly,
			Meaning: "CIDRs whose `X-Forwarded-For` is believed"},
			binding{
				parse: func(c *Config, v string) error {
					p, err := ParsePrefixes(v)
					if err != nil {
						return fmt.Errorf("CIDRs or addresses, comma-separated (%w)", err)
					}
					c.TrustedProxies = p
					return nil
				},
				show: func(c *Config) string {
					var s []string
					for _, p := range c.TrustedProxies {
						s = append(s, p.String())
					}
					return strings.Join(s, ",")
				},
			}),
		bind(Setting{Name: "FLASHSALE_CORS_ORIGINS", Roles: gwOnly,
			Meaning: "origins of a CDN-hosted page allowed to call the API"},
			list(func(c *Config) *[]string { return &c.CORSOrigins })),
		bind(Setting{Name: "FLASHSALE_DB_MAX_CONNS", Default: "`16`", Bounds: "> 0", Roles: "gateway, expiry",
			Meaning: "database pool size"},
			positive(func(c *Config) *int32 { return &c.DBMaxConns })),
		bind(Setting{Name: "FLASHSALE_DB_MIN_CONNS", Default: "`8`", Bounds: "> 0", Roles: "gateway, expiry",
			Meaning: "pool connections opened at start and kept"},
			positive(func(c *Config) *int32 { return &c.DBMinConns })),
		bind(Setting{Name: "FLASHSALE_WRITER_BATCH_SIZE", Default: "`500`", Bounds: "> 0", Roles: "writer",
			Meaning: "orders per writer transaction"},
			positive(func(c *Config) *int { return &c.WriterBatchSize })),
		bind(Setting{Name: "FLASHSALE_WRITER_IN_FLIGHT", Default: "`2`", Bounds: "> 0", Roles: "writer",
			Meaning: "writer batches whose transactions run at once"},
			positive(func(c *Config) *int { return &c.WriterInFlight })),
		bind(Setting{Name: "FLASHSALE_WRITER_MAX_CONNS", Default: "`4`", Bounds: "> 0", Roles: "writer",
			Meaning: "writer pool size"},
			positive(func(c *Config) *int32 { return &c.WriterMaxConns })),
		bind(Setting{Name: "FLASHSALE_KAFKA_PRODUCERS", Default: "`4`", Bounds: "> 0", Roles: gwOnly,
			Meaning: "idempotent Kafka producers per gateway"},
			positive(func(c *Config) *int { return &c.KafkaProducers })),
		bind(Setting{Name: "FLASHSALE_RECONCILE_AFTER", Default: "`2m`", Bounds: "> 0", Roles: gwOnly,
			Meaning: "age after which a reservation not in the database is looked at"},
			positiveDur(func(c *Config) *time.Duration { return &c.ReconcileAfter })),
		bind(Setting{Name: "FLASHSALE_KAFKA_SESSION_TIMEOUT", Default: "`6s`", Bounds: "> 0", Roles: "writer",
			Meaning: "how long the broker waits for a silent writer"},
			positiveDur(func(c *Config) *time.Duration { return &c.KafkaSessionTimeout })),
		bind(Setting{Name: "FLASHSALE_WRITER_INSTANCE_ID", Roles: "writer",
			Meaning: "static group member id, one stable id per writer"},
			str(func(c *Config) *string { return &c.WriterInstanceID })),
		bind(Setting{Name: "FLASHSALE_CAPACITY_FACTOR", Default: "`2`", Bounds: "> 0", Roles: gwOnly,
			Meaning: "admitted-but-unused places allowed per remaining unit"},
			binding{
				parse: func(c *Config, v string) error {
					f, err := strconv.ParseFloat(v, 64)
					if err != nil || f <= 0 {
						return errors.New("a positive number")
					}
					c.CapacityFactor = f
					return nil
				},
				show: func(c *Config) string { return strconv.FormatFloat(c.CapacityFactor, 'g', -1, 64) },
			}),
		bind(Setting{Name: "FLASHSALE_DRAW_LEAD", Default: "`3s`", Bounds: "≥ 0", Roles: gwOnly,
			Meaning: "how long before the opening the draw runs; `0`: at the opening"},
			duration(func(c *Config) *time.Duration { return &c.DrawLead }, 0, 0, "a duration like 3s, or 0 to draw at the opening")),
		bind(Setting{Name: "FLASHSALE_QUEUE_KEY_TTL", Default: "`24h`", Bounds: "≥ 0", Roles: gwOnly,
			Meaning: "how long a sale's waiting-room keys outlive its end; `0`: forever"},
			duration(func(c *Config) *time.Duration { return &c.QueueKeyTTL }, 0, 0, "a duration like 24h, or 0 to keep the keys")),
		bind(Setting{Name: "FLASHSALE_ADMITTED_GRACE", Default: "`20s`", Bounds: "> 0, ≤ 30s", Roles: gwOnly,
			Meaning: "how long an admitted shopper may be gone and still count"},
			duration(func(c *Config) *time.Duration { return &c.AdmittedGrace }, time.Nanosecond, 30*time.Second,
				"a positive duration, at most 30s (a gone shopper's place is freed after it)")),
		bind(Setting{Name: "FLASHSALE_OPENING_HOLD", Default: "`3s`", Bounds: "≥ 0", Roles: gwOnly,
			Meaning: "from the opening, no position updates for this long; `0`: none"},
			binding{
				parse: func(c *Config, v string) error {
					d, err := time.ParseDuration(v)
					if v == "0" {
						d, err = 0, nil
					}
					if err != nil || d < 0 {
						return errors.New("a duration, 0s for none")
					}
					c.OpeningHold = d
					if d == 0 {
						c.OpeningHold = -1 // waitroom's 0 is its default
					}
					return nil
				},
				show: func(c *Config) string {
					switch {
					case c.OpeningHold < 0:
						return "0"
					case c.OpeningHold == 0:
						return "" // waitroom's default
					}
					return c.OpeningHold.String()
				},
			}),
		bind(Setting{Name: "FLASHSALE_WS_MAX_CONNS_PER_ADDR", Default: "`200`", Bounds: "> 0", Roles: gwOnly,
			Meaning: "room connections of one client address on one gateway"},
			positive(func(c *Config) *int { return &c.WSMaxConnsPerAddr })),
		bind(Setting{Name: "FLASHSALE_MAX_PENDING_CONNS_PER_ADDR", Default: "`64`", Bounds: "> 0", Roles: gwOnly,
			Meaning: "connections of one client address before their first request"},
			positive(func(c *Config) *int { return &c.MaxPendingConnsPerAddr })),
		bind(Setting{Name: "FLASHSALE_DRAW_IDENTITY_MAX", Default: "`1048576`", Bounds: "> 0", Roles: gwOnly,
			Meaning: "bytes: a larger draw record is sent gzip-encoded"},
			positive(func(c *Config) *int { return &c.DrawIdentityMax })),
		bind(Setting{Name: "FLASHSALE_CLOCK_MAX_OFFSET", Default: "`500ms`", Bounds: "> 0", Roles: serving,
			Meaning: "offset to Redis `TIME` past which `/readyz` notes the clock"},
			positiveDur(func(c *Config) *time.Duration { return &c.ClockMaxOffset })),
		bind(Setting{Name: "FLASHSALE_CLOCK_SKEW", Default: "`0`", Bounds: "any duration", Roles: serving,
			Meaning: "drills and tests: this process's clock runs off by this much"},
			duration(func(c *Config) *time.Duration { return &c.ClockSkew }, -1<<63, 0, "a duration like 2s or -2s")),
		bind(Setting{Name: "FLASHSALE_DEFENSE_SHARE_INTERVAL", Default: "`100ms`", Bounds: "0–1s", Roles: gwOnly,
			Meaning: "how often a gateway shares its rate-limit spend; `0`: never"},
			duration(func(c *Config) *time.Duration { return &c.DefenseShareInterval }, 0, time.Second,
				"a duration up to 1s like 100ms, or 0 for none")),
		bind(Setting{Name: "FLASHSALE_GATEWAY_ID", Default: "host name + random suffix", Bounds: "≤ 64 characters, no spaces", Roles: gwOnly,
			Meaning: "names the gateway in the fleet's defense figures"},
			binding{
				parse: func(c *Config, v string) error {
					if len(v) > 64 || strings.ContainsFunc(v, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
						return errors.New("at most 64 characters without spaces")
					}
					c.GatewayID = v
					return nil
				},
				show: func(c *Config) string { return c.GatewayID },
			}),
		bind(Setting{Name: "FLASHSALE_DRAIN_PERIOD", Flag: "drain-period", Default: "`5s` (dev: `0`)", Bounds: "≥ 0", Roles: serving,
			Meaning: "after SIGTERM, how long `/readyz` answers 503 before the listeners close"},
			duration(func(c *Config) *time.Duration { return &c.DrainPeriod }, 0, 0, "a duration like 5s, or 0 for none")),
		bind(Setting{Name: "FLASHSALE_LOG_FORMAT", Flag: "log-format", Default: "`json` (dev: `text`)", Bounds: "`json` or `text`", Roles: anyRole,
			Meaning: "log format"},
			binding{
				parse: func(c *Config, v string) error {
					if v != "json" && v != "text" {
						return errors.New("json or text")
					}
					c.LogFormat = v
					return nil
				},
				show: func(c *Config) string { return c.LogFormat },
			}),
		bind(Setting{Name: "FLASHSALE_LOG_LEVEL", Default: "`info`", Bounds: "`debug`, `info`, `warn`, `error`", Roles: anyRole,
			Meaning: "least level logged"},
			binding{
				parse: func(c *Config, v string) error {
					if !slogLevel(v) {
						return errors.New("debug, info, warn or error")
					}
					c.LogLevel = v
					return nil
				},
				show: func(c *Config) string { return c.LogLevel },
			}),
		bind(Setting{Name: "FLASHSALE_DATA_DIR", Flag: "data-dir", Default: "`.flashsale`", Roles: "dev",
			Meaning: "where dev's local Redis, PostgreSQL and Kafka keep their data"},
			str(func(c *Config) *string { return &c.DataDir })),
	}
}

// RemovedSettings are variables flashsale no longer reads: pacing an
// operator never needs to change, now constants of their package.
func RemovedSettings() []string {
	return []string{"FLASHSALE_WAITING_PUSHES", "FLASHSALE_STATUS_EVERY"}
}

// FromEnv overlays the settings of the environment, read with getenv, on
// c, and refuses a value out of its bounds, naming its variable.
func (c *Config) FromEnv(getenv func(string) string) error {
	var errs []error
	for _, s := range Settings() {
		v := getenv(s.Name)
		if v == "" {
			continue
		}
		if err := s.parse(c, v); err != nil {
			errs = append(errs, s.refused(v, err))
		}
	}
	return errors.Join(errs...)
}

// refused is the error of v refused with err: err as it is when it names
// the variable already, else the variable, the value (not a secret's) and
// what is wanted.
func (s Setting) refused(v string, err error) error {
	if strings.HasPrefix(err.Error(), s.Name) {
		return err
	}
	if s.Secret {
		v = "…"
	}
	return fmt.Errorf("%s=%q: want %w", s.Name, v, err)
}

// LoadEnv overlays this process's environment on c (FromEnv). It is the
// one place flashsale reads its environment (layout_test.go).
func (c *Config) LoadEnv() error {
	return c.FromEnv(os.Getenv)
}

// RegisterFlags adds to fs a flag for each named setting that has one; the
// flags override the environment. A name the spec does not know panics:
// it is a programming error.
func (c *Config) RegisterFlags(fs *flag.FlagSet, names ...string) {
	byName := make(map[string]Setting)
	for _, s := range Settings() {
		byName[s.Name] = s
	}
	for _, n := range names {
		s, ok := byName[n]
		if !ok || s.Flag == "" {
			panic("wiring.RegisterFlags: " + n + " has no flag in the spec")
		}
		fs.Var(&settingFlag{c: c, s: s}, s.Flag, strings.ReplaceAll(s.Meaning, "`", "")+" ("+s.Name+")")
	}
}

// settingFlag is a setting as a flag.Value.
type settingFlag struct {
	c *Config
	s Setting
}

func (f *settingFlag) String() string {
	if f == nil || f.c == nil {
		return ""
	}
	return f.s.show(f.c)
}

func (f *settingFlag) Set(v string) error {
	if err := f.s.parse(f.c, v); err != nil {
		return f.s.refused(v, err)
	}
	return nil
}

// WriteSettings prints every setting's effective value in c, one a line,
// secrets redacted, with the roles that read it.
func WriteSettings(w io.Writer, c *Config) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, s := range Settings() {
		v := s.show(c)
		if s.Secret && v != "" {
			v = "<redacted>"
		}
		if v == "" {
			v = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", s.Name, v, s.Roles)
	}
	return tw.Flush()
}

// SettingsMarkdown is the README's table of the settings.
func SettingsMarkdown() string {
	var b strings.Builder
	b.WriteString("| variable | flag | default | bounds | roles | meaning |\n| --- | --- | --- | --- | --- | --- |\n")
	cell := func(v string) string {
		if v == "" {
			return "–"
		}
		return v
	}
	for _, s := range Settings() {
		flagCell := ""
		if s.Flag != "" {
			flagCell = "`--" + s.Flag + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s | %s |\n", s.Name, cell(flagCell), cell(s.Default), cell(s.Bounds), s.Roles, s.Meaning)
	}
	return b.String()
}

func slogLevel(v string) bool {
	var l slog.Level
	return l.UnmarshalText([]byte(v)) == nil
}
