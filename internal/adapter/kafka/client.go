package kafka

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// SASL mechanisms Security.SASLMechanism accepts.
const (
	MechanismPlain       = "PLAIN"
	MechanismScramSHA256 = "SCRAM-SHA-256"
	MechanismScramSHA512 = "SCRAM-SHA-512"
)

// Security is how every client flashsale builds reaches the brokers: TLS
// and SASL. The zero value is plaintext without authentication (the
// embedded broker).
type Security struct {
	// TLS dials the brokers with TLS. CAFile is a PEM file of the CAs the
	// brokers' certificates are checked against ("": the system's roots);
	// CertFile and KeyFile, both or neither, are a client certificate for
	// brokers that require one. The files are read when the options are
	// built, so a bad file fails the client's construction, at start.
	TLS                       bool
	CAFile, CertFile, KeyFile string
	// SASLMechanism is "" (no SASL), PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512;
	// Username and Password are required with one. PLAIN sends the password
	// as is: use it over TLS only.
	SASLMechanism      string
	Username, Password string
}

// String describes s for errors and logs, without the password (which
// %v of a Security therefore never shows).
func (s Security) String() string {
	out := "plaintext"
	if s.TLS {
		out = "TLS"
		if s.CertFile != "" {
			out += " with a client certificate"
		}
	}
	if s.SASLMechanism == "" {
		return out + ", no SASL"
	}
	return out + ", SASL " + s.SASLMechanism + " as " + strconv.Quote(s.Username)
}

// Check reports what is wrong with s, reading its files as ClientOpts does.
func (s Security) Check() error {
	_, err := s.opts()
	return err
}

// ClientOpts returns the options every franz-go client of flashsale starts
// from: the seed brokers, s's TLS and SASL, and logger (franz-go's warnings
// and errors, tagged with the caller's component). It is the one place
// these are built; the producer, the order log, the topic set-up, the
// writer's consumer and the wiring's broker check all take it.
func ClientOpts(brokers []string, s Security, logger *slog.Logger) ([]kgo.Opt, error) {
	if len(brokers) == 0 {
		return nil, errors.New("kafka.ClientOpts: no brokers")
	}
	sec, err := s.opts()
	if err != nil {
		return nil, fmt.Errorf("kafka.ClientOpts: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.WithLogger(kgoLogger{logger})}, sec...), nil
}

func (s Security) opts() ([]kgo.Opt, error) {
	var out []kgo.Opt
	if s.TLS {
		c, err := s.tlsConfig()
		if err != nil {
			return nil, err
		}
		out = append(out, kgo.DialTLSConfig(c))
	} else if s.CAFile != "" || s.CertFile != "" || s.KeyFile != "" {
		return nil, errors.New("TLS files are set but TLS is off")
	}
	if s.SASLMechanism == "" {
		if s.Username != "" || s.Password != "" {
			return nil, errors.New("SASL username or password set without a SASL mechanism")
		}
		return out, nil
	}
	if s.Username == "" || s.Password == "" {
		return nil, fmt.Errorf("SASL %s needs a username and a password", s.SASLMechanism)
	}
	var m sasl.Mechanism
	switch s.SASLMechanism {
	case MechanismPlain:
		m = plain.Auth{User: s.Username, Pass: s.Password}.AsMechanism()
	case MechanismScramSHA256:
		m = scram.Auth{User: s.Username, Pass: s.Password}.AsSha256Mechanism()
	case MechanismScramSHA512:
		m = scram.Auth{User: s.Username, Pass: s.Password}.AsSha512Mechanism()
	default:
		return nil, fmt.Errorf("SASL mechanism %q: want %s, %s or %s", s.SASLMechanism, MechanismPlain, MechanismScramSHA256, MechanismScramSHA512)
	}
	return append(out, kgo.SASL(m)), nil
}

// tlsConfig leaves ServerName empty: franz-go sets it to the host of each
// broker it dials, so every broker's certificate is checked against its own
// name.
func (s Security) tlsConfig() (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if s.CAFile != "" {
		b, err := os.ReadFile(s.CAFile)
		if err != nil {
			return nil, fmt.Errorf("TLS CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, fmt.Errorf("TLS CA %s: no PEM certificate", s.CAFile)
		}
		c.RootCAs = pool
	}
	if (s.CertFile == "") != (s.KeyFile == "") {
		return nil, errors.New("TLS client certificate and key go together: set both or neither")
	}
	if s.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(s.CertFile, s.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("TLS client certificate: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// kgoLogger sends franz-go's warnings and errors to slog.
type kgoLogger struct{ l *slog.Logger }

func (k kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (k kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	switch level {
	case kgo.LogLevelError:
		k.l.Error(msg, keyvals...)
	case kgo.LogLevelWarn:
		k.l.Warn(msg, keyvals...)
	default:
		k.l.Debug(msg, keyvals...)
	}
}
