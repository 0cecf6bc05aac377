// Package wiring is the composition root: the one package that builds the
// adapters and components and wires them into running roles (gateway,
// writer, expiry) from one resolved configuration. No other package
// imports the components together. cmd/flashsale builds the
// configuration from the environment and flags; tests, the load harness and
// the browser tests start a whole stack in-process through Start.
package wiring

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/flashsale/flashsale/auth"
	"github.com/flashsale/flashsale/events"
	"github.com/flashsale/flashsale/gateway"
	"github.com/flashsale/flashsale/internal/adapter/kafka"
	"github.com/flashsale/flashsale/internal/adapter/redisconn"
	"github.com/flashsale/flashsale/waitroom"
)

// Config is the resolved configuration of every role.
type Config struct {
	HTTPAddr  string // public listener
	AdminAddr string // metrics, health, pprof

	RedisURL    string
	DatabaseURL string
	// RedisCluster, RedisSentinels with RedisMaster, RedisPassword and
	// RedisTLSCA are the other Redis topologies and their credentials
	// (redisconn.Config; exactly one topology is set).
	RedisCluster   []string
	RedisSentinels []string
	RedisMaster    string
	RedisPassword  string
	RedisTLSCA     string
	KafkaBrokers   []string // empty: an embedded kfake broker in this process
	// KafkaPort fixes the embedded broker's port on 127.0.0.1 (0: any free
	// port), so other processes can reach it (FLASHSALE_KAFKA_PORT).
	KafkaPort int
	// KafkaDataDir keeps the embedded broker's data across restarts,
	// every batch written before it is acknowledged (FLASHSALE_KAFKA_DATA_DIR; dev: .flashsale/kafka;
	// "": in memory).
	KafkaDataDir string
	// KafkaSecurity is the TLS and SASL of every client to configured
	// brokers (FLASHSALE_KAFKA_TLS*, FLASHSALE_KAFKA_SASL_MECHANISM,
	// FLASHSALE_KAFKA_USERNAME, FLASHSALE_KAFKA_PASSWORD); the embedded
	// broker speaks neither.
	KafkaSecurity kafka.Security
	// KafkaTopics are the partitions and replication factor of the topics
	// flashsale creates on configured brokers (FLASHSALE_KAFKA_PARTITIONS,
	// FLASHSALE_KAFKA_REPLICATION_FACTOR).
	KafkaTopics kafka.TopicSettings

	JWTSecret     string
	JWTPublicKeys []string // PEM files of extra accepted signing keys
	AdmissionKey  string   // HMAC key of admission tokens; empty: derived from JWTSecret
	// JWTJWKSURL is an identity provider's JWK Set, whose keys are also
	// accepted (FLASHSALE_JWT_JWKS_URL); JWTIssuer and JWTAudience, when
	// set, are required in the iss and aud of tokens verified with a
	// public key (FLASHSALE_JWT_ISSUER, FLASHSALE_JWT_AUDIENCE).
	JWTJWKSURL  string
	JWTIssuer   string
	JWTAudience string

	PaymentWindow   time.Duration
	ExpiryInterval  time.Duration
	AdmissionTTL    time.Duration
	TrustedProxies  []netip.Prefix
	CORSOrigins     []string
	DBMaxConns      int32
	DBMinConns      int32 // opened at start and kept (postgres.Config.MinConns)
	WriterBatchSize int
	WriterInFlight  int // batches whose transactions run at once (writer.Config.InFlight)
	WriterMaxConns  int32
	KafkaProducers  int // idempotent producers per gateway (kafka.ProducerConfig.Producers)
	ReconcileAfter  time.Duration
	CapacityFactor  float64
	TokenCacheSize  int // verified access tokens kept per process
	// DrawLead is how long before a sale's opening its pre-queue closes,
	// its draw runs and its first wave is admitted (waitroom.Config.DrawLead,
	// FLASHSALE_DRAW_LEAD; 0: at the opening).
	DrawLead time.Duration

	// KafkaSessionTimeout is the writer group's session timeout
	// (writer.Config.SessionTimeout, FLASHSALE_KAFKA_SESSION_TIMEOUT).
	KafkaSessionTimeout time.Duration
	// WriterInstanceID makes the writer a static group member
	// (writer.Config.InstanceID, FLASHSALE_WRITER_INSTANCE_ID).
	WriterInstanceID string

	// WaitingPushes and StatusEvery pace the waiting room's WAITING
	// statuses (waitroom.Config); 0: its defaults.
	WaitingPushes int
	StatusEvery   time.Duration
	// OpeningHold holds position updates back for this long from an
	// opening (waitroom.Config.OpeningHold, FLASHSALE_OPENING_HOLD); 0:
	// its default; negative: none.
	OpeningHold time.Duration
	// WSMaxConnsPerAddr caps one client address's room connections on one
	// gateway (waitroom.Config.MaxConnsPerIP). Raise it for shoppers behind
	// carrier-grade NAT.
	WSMaxConnsPerAddr int
	// MaxPendingConnsPerAddr caps the connections one client address (an
	// IPv4 address, an IPv6 /64) may hold on the public port before their
	// first request (gateway.Config.MaxPendingPerAddr,
	// FLASHSALE_MAX_PENDING_CONNS_PER_ADDR); trusted proxies are not
	// capped.
	MaxPendingConnsPerAddr int
	// DrawIdentityMax is the largest draw record a gateway sends
	// uncompressed; a larger one is sent gzip-encoded to every client
	// (gateway.Config.DrawIdentityMax, FLASHSALE_DRAW_IDENTITY_MAX, bytes;
	// 0: its default, 1 MiB).
	DrawIdentityMax int
	// JWTMaxLifetime is the longest access-token lifetime accepted
	// (auth.WithMaxLifetime, FLASHSALE_JWT_MAX_LIFETIME).
	JWTMaxLifetime time.Duration
	// AdmittedGrace is how long an admitted shopper may be gone (no
	// connection on any gateway) before its place stops counting against
	// the capacity cap (waitroom.Config.AdmittedGrace,
	// FLASHSALE_ADMITTED_GRACE, at most 30s).
	AdmittedGrace time.Duration
	// QueueKeyTTL is how long after a sale's end its queue keys stay in
	// Redis (waitroom.Config.QueueKeyTTL, FLASHSALE_QUEUE_KEY_TTL; 0: they
	// never expire).
	QueueKeyTTL time.Duration
	// DefenseShareInterval is how often a gateway shares its rate-limit
	// spend with the others so that limits hold across the fleet
	// (defense.GuardConfig.ShareInterval, FLASHSALE_DEFENSE_SHARE_INTERVAL,
	// at most 1s; 0: each gateway limits on its own).
	DefenseShareInterval time.Duration
	// ClockSkew makes this process's own clock run off by this much
	// (redisclock.Config.Skew, FLASHSALE_CLOCK_SKEW, may be negative):
	// drills and tests inject a wrong clock with it.
	ClockSkew time.Duration
	// ClockMaxOffset is the offset to the fleet clock (Redis TIME) past
	// which /readyz notes this process's clock (redisclock.Config.MaxOffset,
	// FLASHSALE_CLOCK_MAX_OFFSET).
	ClockMaxOffset time.Duration
	// GatewayID names this gateway in the fleet's defense figures
	// (defense.GuardConfig.GatewayID, FLASHSALE_GATEWAY_ID; empty: host
	// name and a random suffix).
	GatewayID string
	// DrainPeriod is how long, after SIGTERM, /readyz answers 503 while
	// the listeners keep serving, so that a load balancer stops sending
	// before they close (FLASHSALE_DRAIN_PERIOD; 0: close at once).
	DrainPeriod time.Duration

	// PaymentSecret keys the signatures of the shop's payment provider's
	// callbacks (FLASHSALE_PAYMENT_SECRET; empty: the callback route is
	// off). PaymentURL is the shop's payment page, with {orderId}
	// (FLASHSALE_PAYMENT_URL; empty: the simulated pay).
	PaymentSecret string
	PaymentURL    string

	// WebhookURL, WebhookSecret and WebhookMaxAttempts configure the
	// order events' webhook (events.WebhookConfig; FLASHSALE_WEBHOOK_URL,
	// FLASHSALE_WEBHOOK_SECRET, FLASHSALE_WEBHOOK_MAX_ATTEMPTS); an empty
	// URL is no webhook.
	WebhookURL         string
	WebhookSecret      string
	WebhookMaxAttempts int

	LogFormat string // "json" or "text"
	LogLevel  string
}

// DefaultDrainPeriod is the drain period of the serving commands: longer
// than a load balancer's usual health-check interval, so that it sees the
// 503 and stops sending before the listeners close.
const DefaultDrainPeriod = 5 * time.Second

// Defaults returns the contract's defaults.
func Defaults() Config {
	return Config{
		HTTPAddr:               "127.0.0.1:8080",
		AdminAddr:              "127.0.0.1:9090",
		PaymentWindow:          10 * time.Minute,
		ExpiryInterval:         30 * time.Second,
		AdmissionTTL:           5 * time.Minute,
		DBMaxConns:             16,
		DBMinConns:             8,
		WriterBatchSize:        500,
		WriterInFlight:         2,
		WriterMaxConns:         4,
		KafkaProducers:         kafka.DefaultProducers,
		ReconcileAfter:         2 * time.Minute,
		CapacityFactor:         2,
		TokenCacheSize:         1 << 18,
		DrawLead:               DefaultDrawLead,
		WSMaxConnsPerAddr:      waitroom.DefaultMaxConnsPerIP,
		MaxPendingConnsPerAddr: gateway.DefaultMaxPendingPerAddr,
		JWTMaxLifetime:         auth.DefaultMaxLifetime,
		AdmittedGrace:          waitroom.DefaultAdmittedGrace,
		QueueKeyTTL:            waitroom.DefaultQueueKeyTTL,
		LogFormat:              "json",
		LogLevel:               "info",

		KafkaSessionTimeout: 6 * time.Second,

		DefenseShareInterval: 100 * time.Millisecond,
		ClockMaxOffset:       500 * time.Millisecond,

		WebhookMaxAttempts: events.DefaultWebhookMaxAttempts,
		DrainPeriod:        DefaultDrainPeriod,
	}
}

// FromEnv overlays FLASHSALE_* environment variables on c.
func (c *Config) FromEnv(getenv func(string) string) error {
	var errs []error
	str := func(name string, dst *string) {
		if v := getenv(name); v != "" {
			*dst = v
		}
	}
	// durOrOff reads a duration where 0 turns the feature off; negative
	// or malformed values are refused with want.
	durOrOff := func(name, want string, set func(time.Duration)) {
		if v := getenv(name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				errs = append(errs, fmt.Errorf("%s=%q: want %s", name, v, want))
				return
			}
			set(d)
		}
	}
	dur := func(name string, dst *time.Duration) {
		if v := getenv(name); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				errs = append(errs, fmt.Errorf("%s=%q: want a positive duration like 30s or 10m", name, v))
				return
			}
			*dst = d
		}
	}
	integer := func(name string, dst *int) {
		if v := getenv(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				errs = append(errs, fmt.Errorf("%s=%q: want a positive integer", name, v))
				return
			}
			*dst = n
		}
	}
	str("FLASHSALE_HTTP_ADDR", &c.HTTPAddr)
	str("FLASHSALE_ADMIN_ADDR", &c.AdminAddr)
	str("FLASHSALE_REDIS_URL", &c.RedisURL)
	if v := getenv("FLASHSALE_REDIS_CLUSTER"); v != "" {
		c.RedisCluster = splitList(v)
	}
	if v := getenv("FLASHSALE_REDIS_SENTINELS"); v != "" {
		c.RedisSentinels = splitList(v)
	}
	str("FLASHSALE_REDIS_MASTER", &c.RedisMaster)
	str("FLASHSALE_REDIS_PASSWORD", &c.RedisPassword)
	str("FLASHSALE_REDIS_TLS_CA", &c.RedisTLSCA)
	str("FLASHSALE_DATABASE_URL", &c.DatabaseURL)
	if v := getenv("FLASHSALE_KAFKA_BROKERS"); v != "" {
		c.KafkaBrokers = splitList(v)
	}
	integer("FLASHSALE_KAFKA_PORT", &c.KafkaPort)
	str("FLASHSALE_KAFKA_DATA_DIR", &c.KafkaDataDir)
	if v := getenv("FLASHSALE_KAFKA_TLS"); v != "" {
		on, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("FLASHSALE_KAFKA_TLS=%q: want 1 or 0", v))
		}
		c.KafkaSecurity.TLS = on
	}
	str("FLASHSALE_KAFKA_TLS_CA", &c.KafkaSecurity.CAFile)
	str("FLASHSALE_KAFKA_TLS_CERT", &c.KafkaSecurity.CertFile)
	str("FLASHSALE_KAFKA_TLS_KEY", &c.KafkaSecurity.KeyFile)
	str("FLASHSALE_KAFKA_SASL_MECHANISM", &c.KafkaSecurity.SASLMechanism)
	str("FLASHSALE_KAFKA_USERNAME", &c.KafkaSecurity.Username)
	str("FLASHSALE_KAFKA_PASSWORD", &c.KafkaSecurity.Password)
	if v := getenv("FLASHSALE_KAFKA_PARTITIONS"); v != "" {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n <= 0 {
			errs = append(errs, fmt.Errorf("FLASHSALE_KAFKA_PARTITIONS=%q: want a positive integer", v))
		}
		c.KafkaTopics.Partitions = int32(n)
	}
	if v := getenv("FLASHSALE_KAFKA_REPLICATION_FACTOR"); v != "" {
		n, err := strconv.ParseInt(v, 10, 16)
		if err != nil || n <= 0 {
			errs = append(errs, fmt.Errorf("FLASHSALE_KAFKA_REPLICATION_FACTOR=%q: want a positive integer", v))
		}
		c.KafkaTopics.ReplicationFactor = int16(n)
	}
	str("FLASHSALE_JWT_SECRET", &c.JWTSecret)
	if v := getenv("FLASHSALE_JWT_PUBLIC_KEYS"); v != "" {
		c.JWTPublicKeys = splitList(v)
	}
	str("FLASHSALE_JWT_JWKS_URL", &c.JWTJWKSURL)
	str("FLASHSALE_JWT_ISSUER", &c.JWTIssuer)
	str("FLASHSALE_JWT_AUDIENCE", &c.JWTAudience)
	str("FLASHSALE_ADMISSION_KEY", &c.AdmissionKey)
	dur("FLASHSALE_PAYMENT_WINDOW", &c.PaymentWindow)
	dur("FLASHSALE_EXPIRY_INTERVAL", &c.ExpiryInterval)
	dur("FLASHSALE_ADMISSION_TTL", &c.AdmissionTTL)
	dur("FLASHSALE_RECONCILE_AFTER", &c.ReconcileAfter)
	dur("FLASHSALE_KAFKA_SESSION_TIMEOUT", &c.KafkaSessionTimeout)
	str("FLASHSALE_WRITER_INSTANCE_ID", &c.WriterInstanceID)
	if v := getenv("FLASHSALE_TRUSTED_PROXIES"); v != "" {
		p, err := ParsePrefixes(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("FLASHSALE_TRUSTED_PROXIES: %w", err))
		}
		c.TrustedProxies = p
	}
	if v := getenv("FLASHSALE_CORS_ORIGINS"); v != "" {
		c.CORSOrigins = splitList(v)
	}
	var n int
	if integer("FLASHSALE_DB_MAX_CONNS", &n); n > 0 {
		c.DBMaxConns = int32(n)
	}
	n = 0
	if integer("FLASHSALE_DB_MIN_CONNS", &n); n > 0 {
		c.DBMinConns = int32(n)
	}
	integer("FLASHSALE_WRITER_BATCH_SIZE", &c.WriterBatchSize)
	integer("FLASHSALE_WRITER_IN_FLIGHT", &c.WriterInFlight)
	integer("FLASHSALE_KAFKA_PRODUCERS", &c.KafkaProducers)
	n = 0
	if integer("FLASHSALE_WRITER_MAX_CONNS", &n); n > 0 {
		c.WriterMaxConns = int32(n)
	}
	if v := getenv("FLASHSALE_CAPACITY_FACTOR"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 {
			errs = append(errs, fmt.Errorf("FLASHSALE_CAPACITY_FACTOR=%q: want a positive number", v))
		}
		c.CapacityFactor = f
	}
	durOrOff("FLASHSALE_DRAW_LEAD", "a duration like 3s, or 0 to draw at the opening", func(d time.Duration) { c.DrawLead = d })
	if v := getenv("FLASHSALE_WAITING_PUSHES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n == 0 || n < -1 {
			errs = append(errs, fmt.Errorf("FLASHSALE_WAITING_PUSHES=%q: want a positive integer, or -1 for no cap", v))
		}
		c.WaitingPushes = n
	}
	dur("FLASHSALE_STATUS_EVERY", &c.StatusEvery)
	durOrOff("FLASHSALE_OPENING_HOLD", "a duration, 0s for none", func(d time.Duration) {
		c.OpeningHold = d
		if d == 0 {
			c.OpeningHold = -1 // waitroom's 0 is its default
		}
	})
	integer("FLASHSALE_WS_MAX_CONNS_PER_ADDR", &c.WSMaxConnsPerAddr)
	integer("FLASHSALE_MAX_PENDING_CONNS_PER_ADDR", &c.MaxPendingConnsPerAddr)
	integer("FLASHSALE_DRAW_IDENTITY_MAX", &c.DrawIdentityMax)
	dur("FLASHSALE_JWT_MAX_LIFETIME", &c.JWTMaxLifetime)
	durOrOff("FLASHSALE_QUEUE_KEY_TTL", "a duration like 24h, or 0 to keep the keys", func(d time.Duration) { c.QueueKeyTTL = d })
	dur("FLASHSALE_ADMITTED_GRACE", &c.AdmittedGrace)
	dur("FLASHSALE_CLOCK_MAX_OFFSET", &c.ClockMaxOffset)
	if v := getenv("FLASHSALE_CLOCK_SKEW"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("FLASHSALE_CLOCK_SKEW=%q: want a duration like 2s or -2s", v))
		}
		c.ClockSkew = d
	}
	if c.AdmittedGrace > 30*time.Second {
		errs = append(errs, fmt.Errorf("FLASHSALE_ADMITTED_GRACE=%s: at most 30s (a gone shopper's place is freed after it)", c.AdmittedGrace))
	}
	if v := getenv("FLASHSALE_DEFENSE_SHARE_INTERVAL"); v != "" {
		// The fleet's overshoot grows with the interval: past a second it
		// is no longer a fleet-wide limit.
		d, err := time.ParseDuration(v)
		if v == "0" {
			d, err = 0, nil
		}
		if err != nil || d < 0 || d > time.Second {
			errs = append(errs, fmt.Errorf("FLASHSALE_DEFENSE_SHARE_INTERVAL=%q: want a duration up to 1s like 100ms, or 0 for none", v))
		} else {
			c.DefenseShareInterval = d
		}
	}
	if v := getenv("FLASHSALE_GATEWAY_ID"); v != "" {
		if len(v) > 64 || strings.ContainsFunc(v, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			errs = append(errs, fmt.Errorf("FLASHSALE_GATEWAY_ID=%q: want at most 64 characters without spaces", v))
		} else {
			c.GatewayID = v
		}
	}
	str("FLASHSALE_PAYMENT_SECRET", &c.PaymentSecret)
	if v := getenv("FLASHSALE_PAYMENT_URL"); v != "" {
		if err := checkPaymentURL(v); err != nil {
			errs = append(errs, err)
		}
		c.PaymentURL = v
	}

	str("FLASHSALE_WEBHOOK_URL", &c.WebhookURL)
	str("FLASHSALE_WEBHOOK_SECRET", &c.WebhookSecret)
	integer("FLASHSALE_WEBHOOK_MAX_ATTEMPTS", &c.WebhookMaxAttempts)
	if v := getenv("FLASHSALE_DRAIN_PERIOD"); v != "" {
		d, err := time.ParseDuration(v)
		if v == "0" {
			d, err = 0, nil
		}
		if err != nil || d < 0 {
			errs = append(errs, fmt.Errorf("FLASHSALE_DRAIN_PERIOD=%q: want a duration like 5s, or 0 for none", v))
		} else {
			c.DrainPeriod = d
		}
	}
	str("FLASHSALE_LOG_FORMAT", &c.LogFormat)
	str("FLASHSALE_LOG_LEVEL", &c.LogLevel)
	return errors.Join(errs...)
}

// Validate checks what every role needs.
func (c *Config) Validate() error {
	var errs []error
	if err := c.Redis().Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.DatabaseURL == "" {
		errs = append(errs, errors.New("FLASHSALE_DATABASE_URL is not set"))
	}
	if c.JWTSecret == "" {
		errs = append(errs, errors.New("FLASHSALE_JWT_SECRET is not set"))
	} else if err := checkSecret("FLASHSALE_JWT_SECRET", c.JWTSecret); err != nil {
		errs = append(errs, err)
	}
	if c.AdmissionKey != "" {
		if err := checkSecret("FLASHSALE_ADMISSION_KEY", c.AdmissionKey); err != nil {
			errs = append(errs, err)
		}
	}
	if (c.JWTIssuer != "" || c.JWTAudience != "") && c.JWTJWKSURL == "" && len(c.JWTPublicKeys) == 0 {
		errs = append(errs, errors.New("FLASHSALE_JWT_ISSUER/FLASHSALE_JWT_AUDIENCE are checked on tokens of public keys, but neither FLASHSALE_JWT_JWKS_URL nor FLASHSALE_JWT_PUBLIC_KEYS is set"))
	}
	if err := c.KafkaSecurity.Check(); err != nil {
		errs = append(errs, fmt.Errorf("kafka TLS/SASL (FLASHSALE_KAFKA_TLS*, FLASHSALE_KAFKA_SASL_MECHANISM, FLASHSALE_KAFKA_USERNAME, FLASHSALE_KAFKA_PASSWORD): %w", err))
	}
	if c.PaymentSecret != "" {
		if err := checkSecret("FLASHSALE_PAYMENT_SECRET", c.PaymentSecret); err != nil {
			errs = append(errs, err)
		}
	}
	if c.PaymentURL != "" {
		if err := checkPaymentURL(c.PaymentURL); err != nil {
			errs = append(errs, err)
		} else if c.PaymentSecret == "" {
			errs = append(errs, errors.New("FLASHSALE_PAYMENT_URL is set but FLASHSALE_PAYMENT_SECRET is not: no order paid on the shop's page could be recorded"))
		}
	}
	if c.KafkaSecurity != (kafka.Security{}) && len(c.KafkaBrokers) == 0 {
		errs = append(errs, errors.New("kafka TLS/SASL is set but FLASHSALE_KAFKA_BROKERS is not (the embedded broker speaks neither)"))
	}
	if err := events.CheckWebhook(c.WebhookURL, []byte(c.WebhookSecret), c.WebhookMaxAttempts); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// MinSecretBytes is the shortest secret accepted for FLASHSALE_JWT_SECRET,
// FLASHSALE_ADMISSION_KEY, FLASHSALE_PAYMENT_SECRET and
// FLASHSALE_WEBHOOK_SECRET: each keys an HMAC whose output anyone can
// see (a token, a signed request), so a short one can be searched for
// offline, and the admission and proof-of-work keys derive from the JWT
// secret.
const MinSecretBytes = events.MinSecretBytes

// checkSecret refuses a secret shorter than MinSecretBytes, naming its
// variable.
func checkSecret(name, v string) error {
	if len(v) < MinSecretBytes {
		return fmt.Errorf("%s is %d bytes: want at least %d random bytes (for example: head -c 32 /dev/urandom | base64)", name, len(v), MinSecretBytes)
	}
	return nil
}

// Redis is the Redis topology of the configuration.
func (c *Config) Redis() redisconn.Config {
	return redisconn.Config{URL: c.RedisURL, Cluster: c.RedisCluster, Sentinels: c.RedisSentinels,
		Master: c.RedisMaster, Password: c.RedisPassword, TLSCA: c.RedisTLSCA}
}

// AdmissionSecret is the admission-token key: configured, or derived from
// the JWT secret so every gateway of one deployment agrees without extra
// configuration.
func (c *Config) AdmissionSecret() []byte {
	if c.AdmissionKey != "" {
		return []byte(c.AdmissionKey)
	}
	sum := sha256.Sum256([]byte("flashsale admission v1\x00" + c.JWTSecret))
	return sum[:]
}

// DrawSecret keys the shoppers' member secrets in draw records
// (waitroom.Config.DrawKey), derived like AdmissionSecret: every gateway
// of one deployment derives the same secrets.
func (c *Config) DrawSecret() []byte {
	sum := sha256.Sum256([]byte("flashsale draw v1\x00" + c.JWTSecret))
	return sum[:]
}

// PowSecret keys proof-of-work challenges, derived like AdmissionSecret.
func (c *Config) PowSecret() []byte {
	sum := sha256.Sum256([]byte("flashsale pow v1\x00" + c.JWTSecret))
	return sum[:]
}

func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// ParsePrefixes parses a comma-separated list of CIDRs or single addresses.
func ParsePrefixes(v string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range splitList(v) {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%q is neither a CIDR nor an address", s)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// DefaultDrawLead is FLASHSALE_DRAW_LEAD's default: long enough for the
// first wave's admissions to reach every shopper before the opening.
const DefaultDrawLead = 3 * time.Second
