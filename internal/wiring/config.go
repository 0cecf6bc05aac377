// Package wiring is the composition root: the one package that builds the
// adapters and components and wires them into running roles (gateway,
// writer, expiry) from one resolved configuration. No other package
// imports the components together. Its configuration spec (Settings, in
// settings.go) declares every operator setting and is the one place the
// environment is read; cmd/flashsale builds the configuration from it and
// the flags. Tests, the load harness and the browser tests start a whole
// stack in-process through Start.
package wiring

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/flashsale/flashsale/auth"
	"github.com/flashsale/flashsale/events"
	"github.com/flashsale/flashsale/gateway"
	"github.com/flashsale/flashsale/internal/adapter/kafka"
	"github.com/flashsale/flashsale/internal/adapter/redisconn"
	"github.com/flashsale/flashsale/push"
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
	// KafkaHost is the listen and advertised address of `flashsale
	// broker` (FLASHSALE_KAFKA_HOST).
	KafkaHost string
	// DataDir is where `flashsale dev` keeps its local Redis, PostgreSQL
	// and Kafka data (FLASHSALE_DATA_DIR).
	DataDir string
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
	// JWTTierSigners names the signers whose tier claim counts
	// (auth.ParseTierSigners, FLASHSALE_JWT_TIER_SIGNERS; empty: none).
	JWTTierSigners []string
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
	// Clock, when set, is the fleet clock in place of Redis TIME
	// (redisclock.Config.Fleet): in-process tests move a sale's timeline
	// with it instead of waiting. No setting reads it; nil, as in every
	// deployed process, is Redis TIME.
	Clock func() time.Time
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

	// PushPublicKey, PushPrivateKey and PushSubject are the VAPID key pair
	// and contact of the turn notifications (push.Config;
	// FLASHSALE_PUSH_VAPID_PUBLIC_KEY, FLASHSALE_PUSH_VAPID_PRIVATE_KEY,
	// FLASHSALE_PUSH_SUBJECT); no keys: notifications off.
	// PushInsecureHosts are the endpoint hosts allowed over http and at
	// private addresses (push.Hosts, FLASHSALE_PUSH_INSECURE_HOSTS).
	PushPublicKey     string
	PushPrivateKey    string
	PushSubject       string
	PushInsecureHosts string

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
		KafkaHost:              "127.0.0.1",
		DataDir:                ".flashsale",
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
		DrawIdentityMax:        gateway.DefaultDrawIdentityMax,
		OpeningHold:            waitroom.DefaultOpeningHold,
		KafkaTopics:            kafka.TopicSettings{Partitions: kafka.DefaultPartitions},
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
	if err := push.CheckKeys(c.PushPublicKey, c.PushPrivateKey, c.PushSubject); err != nil {
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
