package push

import (
	"context"
	"crypto/ecdh"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"time"

	webpush "github.com/SherClockHolmes/webpush-go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashsale/flashsale/internal/adapter/prom"
)

// Config configures a Sender. Zero values take the defaults in brackets.
type Config struct {
	// PublicKey and PrivateKey are the VAPID key pair (RFC 8292), base64url:
	// the uncompressed P-256 point and the 32-byte scalar
	// (FLASHSALE_PUSH_VAPID_PUBLIC_KEY, FLASHSALE_PUSH_VAPID_PRIVATE_KEY).
	PublicKey, PrivateKey string
	// Subject is the operator's contact the push services see in the
	// VAPID token: a mailto: or https: URL (FLASHSALE_PUSH_SUBJECT).
	Subject string
	// Queue bounds the admitted batches waiting for the sender [1024]; a
	// batch that finds it full is dropped and counted.
	Queue int
	// Timeout bounds one request to a push service [10s].
	Timeout time.Duration
	// TTL is how long a push service keeps a notification for a browser
	// that is offline [5m]: a turn told later than that is of no use.
	TTL time.Duration
	// Insecure are the hosts a subscription may name at a loopback or
	// private address (Parse's Hosts): the default client refuses to
	// connect anywhere else but a public address.
	Insecure Hosts
	// Client sends the requests [publicClient: an http.Client with
	// Timeout that connects to public addresses only].
	Client *http.Client
}

// CheckKeys checks a VAPID key pair: both set or neither, the public key
// the private key's, and the subject a mailto: or https: URL.
func CheckKeys(public, private, subject string) error {
	if public == "" && private == "" {
		return nil
	}
	if public == "" || private == "" {
		return errors.New("FLASHSALE_PUSH_VAPID_PUBLIC_KEY and FLASHSALE_PUSH_VAPID_PRIVATE_KEY are set together")
	}
	priv, err := decodeKey(private)
	if err != nil || len(priv) != 32 {
		return errors.New("FLASHSALE_PUSH_VAPID_PRIVATE_KEY: a 32-byte P-256 key, base64url")
	}
	k, err := ecdh.P256().NewPrivateKey(priv)
	if err != nil {
		return fmt.Errorf("FLASHSALE_PUSH_VAPID_PRIVATE_KEY: %w", err)
	}
	pub, err := decodeKey(public)
	if err != nil || string(pub) != string(k.PublicKey().Bytes()) {
		return errors.New("FLASHSALE_PUSH_VAPID_PUBLIC_KEY is not the public key of FLASHSALE_PUSH_VAPID_PRIVATE_KEY")
	}
	if !strings.HasPrefix(subject, "mailto:") && !strings.HasPrefix(subject, "https://") {
		return errors.New("FLASHSALE_PUSH_SUBJECT: a mailto: or https:// URL, the operator's contact for the push services")
	}
	return nil
}

// GenerateKeys makes a VAPID key pair, base64url without padding.
func GenerateKeys() (public, private string, err error) {
	k, err := ecdh.P256().GenerateKey(rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("push.GenerateKeys: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(k.PublicKey().Bytes()), base64.RawURLEncoding.EncodeToString(k.Bytes()), nil
}

// batch is one report of Admitted: users returns the users it is for.
// The sale's leader hands it over unresolved, so that reading whom the
// cursor passed costs the tick nothing, and costs nothing at all in a sale
// nobody subscribed in.
type batch struct {
	saleID int64
	users  func(ctx context.Context) ([]int64, error)
}

// Sender sends the notifications of the admissions the sale leaders report.
// One goroutine, Run, does all the sending; Admitted only queues.
type Sender struct {
	cfg   Config
	store *Store
	jobs  chan batch
	log   *slog.Logger
	m     struct {
		sent    *prometheus.CounterVec
		dropped prometheus.Counter
	}
}

// Outcomes of flashsale_push_notifications_total.
const (
	outcomeSent    = "sent"    // the push service accepted it (2xx)
	outcomeGone    = "gone"    // 404 or 410: the subscription was dropped
	outcomeRefused = "refused" // another status
	outcomeFailed  = "failed"  // no answer
)

// New returns a Sender of cfg's keys over store's subscriptions.
func New(cfg Config, store *Store, logger *slog.Logger, reg prometheus.Registerer) *Sender {
	if cfg.Queue <= 0 {
		cfg.Queue = 1024
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.TTL <= 0 {
		cfg.TTL = 5 * time.Minute
	}
	if cfg.Client == nil {
		cfg.Client = publicClient(cfg.Timeout, cfg.Insecure)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Sender{cfg: cfg, store: store, jobs: make(chan batch, cfg.Queue), log: logger.With("component", "push")}
	var errs [2]error
	s.m.sent, errs[0] = prom.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flashsale_push_notifications_total",
		Help: "Turn notifications by outcome: sent (2xx), gone (404/410, subscription dropped), refused (another status), failed (no answer).",
	}, []string{"outcome"}))
	s.m.dropped, errs[1] = prom.Register(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "flashsale_push_batches_dropped_total",
		Help: "Admitted batches not notified: the sender's queue was full, or the process stopped first.",
	}))
	if err := errors.Join(errs[:]...); err != nil {
		s.log.Error("push metrics not exported", "err", err)
	}
	for _, o := range []string{outcomeSent, outcomeGone, outcomeRefused, outcomeFailed} {
		s.m.sent.WithLabelValues(o)
	}
	return s
}

// PublicKey is the VAPID public key the page subscribes with.
func (s *Sender) PublicKey() string { return s.cfg.PublicKey }

// Admitted queues the notifications of the sale's shoppers users returns.
// It never blocks: the sale's leader calls it from its tick, once per
// admission it made; a full queue drops the batch.
func (s *Sender) Admitted(saleID int64, users func(ctx context.Context) ([]int64, error)) {
	select {
	case s.jobs <- batch{saleID: saleID, users: users}:
	default:
		s.m.dropped.Inc()
		s.log.Warn("push queue full: admissions not notified", "sale", saleID)
	}
}

// Run sends until ctx ends, then returns nil; the request in flight is
// finished (within Timeout), the batches still queued are dropped.
func (s *Sender) Run(ctx context.Context) error {
	for {
		// A stop is seen before the next batch, which select alone would
		// pick at random when both are ready.
		if ctx.Err() != nil {
			for {
				select {
				case <-s.jobs:
					s.m.dropped.Inc()
				default:
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
		case b := <-s.jobs:
			s.send(ctx, b)
		}
	}
}

// lookupChunk bounds the users of one subscription lookup.
const lookupChunk = 1000

// send notifies one batch. Its Redis reads stop with ctx; a request
// started is finished.
func (s *Sender) send(ctx context.Context, b batch) {
	any, err := s.store.Any(ctx, b.saleID)
	if err != nil || !any {
		if err != nil && ctx.Err() == nil {
			s.log.Warn("read push subscriptions", "sale", b.saleID, "err", err)
		}
		return
	}
	users, err := b.users(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("resolve admitted shoppers", "sale", b.saleID, "err", err)
		}
		return
	}
	for len(users) > 0 {
		chunk := users[:min(len(users), lookupChunk)]
		users = users[len(chunk):]
		subs, err := s.store.lookup(ctx, b.saleID, chunk)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("read push subscriptions", "sale", b.saleID, "err", err)
			}
			return
		}
		for _, u := range chunk {
			if sub, ok := subs[u]; ok {
				s.notify(ctx, b.saleID, u, sub)
			}
		}
	}
}

// Notice is the notification's payload, read by the page's service
// worker (static/site/sw.js): it shows the turn in the browser's language
// and opens URL on a click.
type Notice struct {
	Type   string `json:"type"` // "admitted"
	SaleID int64  `json:"saleId"`
	URL    string `json:"url"` // the sale page, a path
}

func (s *Sender) notify(ctx context.Context, saleID, userID int64, sub stored) {
	payload, _ := json.Marshal(Notice{Type: "admitted", SaleID: saleID, URL: "/sales/" + strconv.FormatInt(saleID, 10)})
	// A request started is finished even when the process stops.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.Timeout)
	defer cancel()
	resp, err := webpush.SendNotificationWithContext(rctx, payload, &webpush.Subscription{
		Endpoint: sub.Endpoint,
		Keys:     webpush.Keys{P256dh: sub.P256dh, Auth: sub.Auth},
	}, &webpush.Options{
		HTTPClient: s.cfg.Client,
		// The library writes "mailto:" before any subject that is not an
		// https: URL.
		Subscriber:      strings.TrimPrefix(s.cfg.Subject, "mailto:"),
		Topic:           "sale" + strconv.FormatInt(saleID, 10),
		TTL:             int(s.cfg.TTL / time.Second),
		Urgency:         webpush.UrgencyHigh,
		VAPIDPublicKey:  s.cfg.PublicKey,
		VAPIDPrivateKey: s.cfg.PrivateKey,
	})
	if err != nil {
		s.m.sent.WithLabelValues(outcomeFailed).Inc()
		s.log.Warn("push a turn", "sale", saleID, "user", userID, "err", err)
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	_ = resp.Body.Close()
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		s.m.sent.WithLabelValues(outcomeSent).Inc()
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone:
		s.m.sent.WithLabelValues(outcomeGone).Inc()
		if _, err := s.store.dropIf(rctx, saleID, userID, sub.raw); err != nil {
			s.log.Warn("drop a gone subscription", "sale", saleID, "user", userID, "err", err)
		}
	default:
		s.m.sent.WithLabelValues(outcomeRefused).Inc()
		s.log.Warn("push service refused a turn", "sale", saleID, "user", userID, "status", resp.StatusCode)
	}
}

// publicClient is the sender's HTTP client. Parse refuses an endpoint
// that names a private address, but a host name may resolve to one (or
// be made to, between the check and the request): so the client checks
// the address it connects to, after resolution, and refuses loopback,
// private, link-local and unspecified ones unless the host is one of
// insecure. It uses no proxy from the environment and follows no
// redirect (a push service answers, it does not redirect).
func publicClient(timeout time.Duration, insecure Hosts) *http.Client {
	strict := &net.Dialer{Timeout: timeout, Control: func(_, address string, _ syscall.RawConn) error {
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			return err
		}
		ip, err := netip.ParseAddr(host)
		if err != nil {
			return err
		}
		if ip = ip.Unmap(); !ip.IsGlobalUnicast() || ip.IsPrivate() {
			return fmt.Errorf("push: %s is not a public address", ip)
		}
		return nil
	}}
	loose := &net.Dialer{Timeout: timeout}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if err == nil && insecure[strings.ToLower(host)] {
				return loose.DialContext(ctx, network, addr)
			}
			return strict.DialContext(ctx, network, addr)
		},
		TLSHandshakeTimeout:   timeout,
		ResponseHeaderTimeout: timeout,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		ForceAttemptHTTP2:     true,
	}
	return &http.Client{
		Timeout:       timeout,
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
