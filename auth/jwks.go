package auth

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/MicahParks/jwkset"
	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
	"golang.org/x/time/rate"
)

// Defaults of JWKSConfig.
const (
	DefaultJWKSRefresh    = 10 * time.Minute
	DefaultJWKSMinRefresh = time.Minute
	DefaultJWKSTimeout    = 5 * time.Second
)

// JWKSConfig configures JWKS. Zero fields take the defaults.
type JWKSConfig struct {
	// URL is the identity provider's JWK Set (http or https).
	URL string
	// Refresh is how often the key set is fetched again (default 10m).
	Refresh time.Duration
	// MinRefresh is the least time between two fetches caused by tokens
	// whose kid is unknown (default 1m): a rotated-in key is found at the
	// first token signed with it, and a flood of tokens with made-up kids
	// costs the provider at most one request per MinRefresh.
	MinRefresh time.Duration
	// Timeout bounds one fetch (default 5s). A token with an unknown kid
	// waits for its fetch at most this long.
	Timeout time.Duration
	// Client does the fetches (nil: a client of its own).
	Client *http.Client
}

// JWKS holds the keys of an identity provider's JWK Set, fetched at
// NewJWKS, every Refresh, and when a token names a kid it does not hold
// (at most once per MinRefresh). A fetch replaces the whole set: a key the
// provider removed is refused from then on.
type JWKS struct {
	url   string
	kf    keyfunc.Keyfunc
	store *keyStore
	http  jwkset.Storage
	ctx   context.Context // ends the refresh loop; bounds every fetch
}

// NewJWKS fetches the key set once and keeps it fresh until ctx ends (the
// caller owns the refresh loop through ctx). A provider unreachable at
// start is not an error: tokens it signs are refused (UNAUTHENTICATED)
// until a fetch succeeds, and Ready reports the missing keys meanwhile.
func NewJWKS(ctx context.Context, cfg JWKSConfig, logger *slog.Logger) (*JWKS, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, fmt.Errorf("auth.NewJWKS: %q is not an http(s) URL", cfg.URL)
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = DefaultJWKSRefresh
	}
	if cfg.MinRefresh <= 0 {
		cfg.MinRefresh = DefaultJWKSMinRefresh
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultJWKSTimeout
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: cfg.Timeout}
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = logger.With("component", "auth-jwks", "url", cfg.URL)
	store := &keyStore{Storage: jwkset.NewMemoryStorage()}
	remote, err := jwkset.NewStorageFromHTTP(cfg.URL, jwkset.HTTPClientStorageOptions{
		Client:                    cfg.Client,
		Ctx:                       ctx,
		HTTPTimeout:               cfg.Timeout,
		NoErrorReturnFirstHTTPReq: true,
		RefreshErrorHandler: func(_ context.Context, err error) {
			logger.Warn("fetching the JWK Set failed; tokens of keys not held are refused", "err", err)
		},
		RefreshInterval: cfg.Refresh,
		Storage:         store,
	})
	if err != nil {
		return nil, fmt.Errorf("auth.NewJWKS: %w", err)
	}
	client, err := jwkset.NewHTTPClient(jwkset.HTTPClientOptions{
		HTTPURLs: map[string]jwkset.Storage{cfg.URL: remote},
		// A refresh that would wait longer than this for the limiter is
		// not waited for: the limiter's interval (MinRefresh) is longer,
		// so a token with an unknown kid between two allowed fetches is
		// refused at once. The same bound covers the fetch.
		RateLimitWaitMax:  cfg.Timeout,
		RefreshUnknownKID: rate.NewLimiter(rate.Every(cfg.MinRefresh), 1),
	})
	if err != nil {
		return nil, fmt.Errorf("auth.NewJWKS: %w", err)
	}
	kf, err := keyfunc.New(keyfunc.Options{Ctx: ctx, Storage: client})
	if err != nil {
		return nil, fmt.Errorf("auth.NewJWKS: %w", err)
	}
	return &JWKS{url: cfg.URL, kf: kf, store: store, http: client, ctx: ctx}, nil
}

// probeKID is a kid no provider uses: Ready reads it to start a
// (rate-limited) fetch while no key is held.
const probeKID = "flashsale-readyz-probe\x00"

// Ready reports whether keys were loaded (for /readyz). While none are, it
// asks for a fetch, within the same limit as tokens with unknown kids.
func (k *JWKS) Ready(ctx context.Context) error {
	if k.store.loaded.Load() {
		return nil
	}
	_, _ = k.http.KeyRead(ctx, probeKID)
	if k.store.loaded.Load() {
		return nil
	}
	return fmt.Errorf("auth.JWKS: no keys loaded from %s yet", k.url)
}

// key returns the key for t (a key, or a jwt.VerificationKeySet when t
// names no kid).
func (k *JWKS) key(t *jwt.Token) (any, error) {
	return k.kf.KeyfuncCtx(k.ctx)(t)
}

// generation changes whenever a fetch removed or changed a key.
func (k *JWKS) generation() uint64 { return k.store.gen.Load() }

// keyStore is the JWK Set's storage: it counts the fetches that removed
// or changed a key, so that a cached verdict on a token signed by a key
// the provider withdrew is not trusted past that fetch.
type keyStore struct {
	jwkset.Storage
	mu     sync.Mutex // serialises replacements
	gen    atomic.Uint64
	loaded atomic.Bool
}

func (s *keyStore) KeyReplaceAll(ctx context.Context, given []jwkset.JWK) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, err := s.Storage.KeyReadAll(ctx)
	if err != nil {
		return fmt.Errorf("auth.JWKS: %w", err)
	}
	if err := s.Storage.KeyReplaceAll(ctx, given); err != nil {
		return fmt.Errorf("auth.JWKS: %w", err)
	}
	kept := make(map[string]bool, len(given))
	for _, j := range given {
		kept[fingerprint(j)] = true
	}
	for _, j := range old {
		if !kept[fingerprint(j)] {
			s.gen.Add(1)
			break
		}
	}
	s.loaded.Store(true)
	return nil
}

// fingerprint identifies a key by its kid and public parameters.
func fingerprint(j jwkset.JWK) string {
	m := j.Marshal()
	return strings.Join([]string{m.KID, string(m.KTY), string(m.ALG), string(m.CRV), m.X, m.Y, m.N, m.E, m.K}, "\x00")
}
