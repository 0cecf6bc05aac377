package wiring_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/flashsale/flashsale"
	"github.com/flashsale/flashsale/internal/adapter/kafka"
	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string // the CA certificate, PEM
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &testCA{cert: cert, key: key, file: filepath.Join(t.TempDir(), name+".pem")}
	writePEM(t, ca.file, "CERTIFICATE", der)
	return ca
}

// issue signs a certificate for 127.0.0.1 (server and client use) and
// returns it as a tls.Certificate and as PEM files.
func (ca *testCA) issue(t *testing.T, name string) (tls.Certificate, string, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "PRIVATE KEY", kder)
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return pair, certFile, keyFile
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// secureBroker starts a kfake broker that requires SASL (user flashsale
// with password, by mechanism) and, with tlsCfg, TLS. port 0 takes any
// free port.
func secureBroker(t *testing.T, port int, mechanism, password string, tlsCfg *tls.Config) *kfake.Cluster {
	t.Helper()
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(port),
		kfake.SeedTopics(4, flashsale.TopicOrders, flashsale.TopicDeadLetter),
		kfake.EnableSASL(),
		kfake.Superuser(mechanism, "flashsale", password),
	}
	if tlsCfg != nil {
		opts = append(opts, kfake.TLS(tlsCfg))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// serverTLS is the broker's TLS config: its certificate from ca, and,
// with clientCA, client certificates required.
func serverTLS(t *testing.T, ca *testCA, clientCA bool) *tls.Config {
	t.Helper()
	cert, _, _ := ca.issue(t, "broker")
	c := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCA {
		pool := x509.NewCertPool()
		pool.AddCert(ca.cert)
		c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return c
}

// buyOne runs a whole order: admission, purchase (published through the
// producer), and the writer's row (the order turns payable).
func buyOne(t *testing.T, s *stack) {
	t.Helper()
	saleID, items := s.createSale(3)
	at := s.admit(200, saleID)
	r := s.purchase(200, items[0], at)
	s.Want(r, 202, "")
	s.waitPayable(200, r.Body["orderId"].(string))
}

func TestKafkaScramOverTLS(t *testing.T) {
	ca := newTestCA(t, "ca")
	b := secureBroker(t, 0, kafka.MechanismScramSHA256, "s3cret", serverTLS(t, ca, true))
	_, certFile, keyFile := ca.issue(t, "client")
	s := startStack(t, func(c *wiring.Config) {
		c.KafkaBrokers = b.ListenAddrs()
		c.KafkaSecurity = kafka.Security{TLS: true, CAFile: ca.file, CertFile: certFile, KeyFile: keyFile,
			SASLMechanism: kafka.MechanismScramSHA256, Username: "flashsale", Password: "s3cret"}
	})
	buyOne(t, s)
	if got := readyz(t, s); got != 200 {
		t.Fatalf("/readyz = %d, want 200", got)
	}
}

func TestKafkaPlain(t *testing.T) {
	ca := newTestCA(t, "ca")
	b := secureBroker(t, 0, kafka.MechanismPlain, "s3cret", serverTLS(t, ca, false))
	s := startStack(t, func(c *wiring.Config) {
		c.KafkaBrokers = b.ListenAddrs()
		c.KafkaSecurity = kafka.Security{TLS: true, CAFile: ca.file,
			SASLMechanism: kafka.MechanismPlain, Username: "flashsale", Password: "s3cret"}
	})
	buyOne(t, s)
}

// startErr starts every role on cfg's Kafka settings and returns Start's
// error (failing the test if it starts).
func startErr(t *testing.T, mutate func(*wiring.Config)) error {
	t.Helper()
	cfg := wiring.Defaults()
	cfg.HTTPAddr, cfg.AdminAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.RedisURL = testenv.RedisURL(t)
	cfg.DatabaseURL = testenv.DatabaseURL(t)
	cfg.JWTSecret = "kafka-sec-jwt-secret-0123456789abcdef"
	mutate(&cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, err := wiring.Start(ctx, cfg, wiring.AllRoles, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil {
		_ = a.Close(context.Background())
		t.Fatal("Start succeeded, want an error")
	}
	return err
}

func TestKafkaRefusedAtStart(t *testing.T) {
	ca := newTestCA(t, "ca")
	b := secureBroker(t, 0, kafka.MechanismScramSHA256, "s3cret", serverTLS(t, ca, false))
	good := kafka.Security{TLS: true, CAFile: ca.file, SASLMechanism: kafka.MechanismScramSHA256, Username: "flashsale", Password: "s3cret"}
	other := newTestCA(t, "other")
	tests := []struct {
		name   string
		mutate func(*kafka.Security)
		want   []string // each in the error, case-insensitive
	}{
		{"wrong password", func(s *kafka.Security) { s.Password = "wrong" }, []string{"kafka", "sasl"}},
		{"wrong mechanism", func(s *kafka.Security) { s.SASLMechanism = kafka.MechanismScramSHA512 }, []string{"kafka", "sasl"}},
		{"wrong CA", func(s *kafka.Security) { s.CAFile = other.file }, []string{"kafka", "certificate"}},
		{"no TLS", func(s *kafka.Security) { s.TLS, s.CAFile = false, "" }, []string{"kafka"}},
		{"unknown mechanism", func(s *kafka.Security) { s.SASLMechanism = "GSSAPI" }, []string{"FLASHSALE_KAFKA_SASL_MECHANISM", "GSSAPI"}},
		{"no password", func(s *kafka.Security) { s.Password = "" }, []string{"password"}},
		{"unreadable CA", func(s *kafka.Security) { s.CAFile = filepath.Join(t.TempDir(), "missing.pem") }, []string{"CA", "missing.pem"}},
		{"cert without key", func(s *kafka.Security) { _, s.CertFile, _ = ca.issue(t, "client") }, []string{"certificate", "key"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sec := good
			tt.mutate(&sec)
			err := startErr(t, func(c *wiring.Config) { c.KafkaBrokers, c.KafkaSecurity = b.ListenAddrs(), sec })
			t.Logf("Start: %v", err)
			for _, w := range tt.want {
				if !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(w)) {
					t.Errorf("Start: %v; want it to name %q", err, w)
				}
			}
		})
	}
}

// TestKafkaRefusedReady: a running stack whose broker starts refusing its
// credentials (the broker back on the same address with another password)
// answers /readyz 503 until the broker accepts them again.
func TestKafkaRefusedReady(t *testing.T) {
	b := secureBroker(t, 0, kafka.MechanismScramSHA256, "s3cret", nil)
	addrs := b.ListenAddrs()
	s := startStack(t, func(c *wiring.Config) {
		c.KafkaBrokers = addrs
		c.KafkaSecurity = kafka.Security{SASLMechanism: kafka.MechanismScramSHA256, Username: "flashsale", Password: "s3cret"}
	})
	if got := readyz(t, s); got != 200 {
		t.Fatalf("/readyz = %d, want 200", got)
	}
	_, p, err := net.SplitHostPort(addrs[0])
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	b = secureBroker(t, port, kafka.MechanismScramSHA256, "rotated", nil)
	// The broker is up and takes its new password; the stack's is refused.
	opts, err := kafka.ClientOpts(addrs, kafka.Security{SASLMechanism: kafka.MechanismScramSHA256, Username: "flashsale", Password: "rotated"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cl.Ping(ctx); err != nil {
		t.Fatalf("ping with the new password: %v", err)
	}
	if got := readyz(t, s); got != 503 {
		t.Fatalf("/readyz = %d while the broker refuses the stack's password, want 503", got)
	}
	// The gauge the alert rules watch says which dependency.
	if got := metricLine(t, s, `flashsale_dependency_up{dependency="kafka"}`); got != "0" {
		t.Fatalf("kafka's dependency_up = %q while refused, want 0", got)
	}
	if got := metricLine(t, s, `flashsale_dependency_up{dependency="redis"}`); got != "1" {
		t.Fatalf("redis's dependency_up = %q, want 1", got)
	}
	b.Close()
	secureBroker(t, port, kafka.MechanismScramSHA256, "s3cret", nil)
	waitReady(t, s, 200)
	if got := metricLine(t, s, `flashsale_dependency_up{dependency="kafka"}`); got != "1" {
		t.Fatalf("kafka's dependency_up = %q once accepted again, want 1", got)
	}
}

// waitReady polls /readyz until it answers want; the deadline only guards
// against a hang.
func waitReady(t *testing.T, s *stack, want int) {
	t.Helper()
	var got int
	testenv.EventuallyF(t, func() string { return fmt.Sprintf("/readyz %d (got %d)", want, got) }, 30*time.Second, func() bool {
		got = readyz(t, s)
		return got == want
	})
}
