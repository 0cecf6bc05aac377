// Package auth verifies and mints the access tokens (JWT) that identify
// shoppers and operators. HS256 is keyed with the bytes of the configured
// secret string; RS256/ES256/EdDSA public keys (PEM, or an identity
// provider's JWK Set, see JWKS) may be added for tokens issued by a shop's
// own identity provider. HS256 tokens are only ever checked against the
// secret and asymmetric ones only against the public keys, so a token
// cannot pass off a public key as an HMAC secret.
//
// Tokens of the secret with a plain HS256 header (as Mint writes it) take a
// fast path: the signature is checked before the payload is read, and a
// payload of only sub, role, exp, iat and nbf, without escapes, whitespace
// or exponents, is decoded by hand instead of by encoding/json. Any other
// token, or anything in one the fast path does not fully read, goes through
// golang-jwt; the two paths accept and refuse the same tokens, with the same
// principal and expiry (FuzzVerifyFastMatchesSlow).
package auth

import (
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/flashsale/flashsale"
)

// leeway is the clock skew tolerated on exp and nbf.
const leeway = 5 * time.Second

// MaxTokenLen bounds the accepted token size before any parsing.
const MaxTokenLen = 4096

// DefaultMaxLifetime is the longest token lifetime accepted unless
// WithMaxLifetime says otherwise (FLASHSALE_JWT_MAX_LIFETIME).
const DefaultMaxLifetime = 24 * time.Hour

// Verifier checks access tokens.
type Verifier struct {
	hmacKey  []byte
	pubKeys  []crypto.PublicKey
	jwks     *JWKS
	issuer   string // of asymmetric tokens, when set
	audience string // one of an asymmetric token's aud, when set
	maxLife  time.Duration
	tier     TierSigners // whose tier claims count
	now      func() time.Time
	parser   *jwt.Parser
	hs256    sync.Pool // *hs256State
}

// Option configures a Verifier.
type Option func(*Verifier)

// WithPublicKey also accepts tokens signed by the private half of key
// (RSA, ECDSA or Ed25519 public key).
func WithPublicKey(key crypto.PublicKey) Option {
	return func(v *Verifier) { v.pubKeys = append(v.pubKeys, key) }
}

// WithJWKS also accepts tokens signed by a key of an identity provider's
// JWK Set.
func WithJWKS(k *JWKS) Option { return func(v *Verifier) { v.jwks = k } }

// WithIssuer requires iss = issuer on tokens verified with a public key
// (PEM or JWKS). Tokens of the HS256 secret are flashsale's own and carry
// none.
func WithIssuer(issuer string) Option { return func(v *Verifier) { v.issuer = issuer } }

// WithAudience requires audience among the aud of tokens verified with a
// public key (PEM or JWKS), as WithIssuer.
func WithAudience(audience string) Option { return func(v *Verifier) { v.audience = audience } }

// WithMaxLifetime refuses tokens that live longer than d: exp − iat, or
// exp − now, more than d (plus the clock-skew leeway). A leaked token then
// stops working within d, however far its issuer put its exp. d <= 0
// keeps DefaultMaxLifetime.
func WithMaxLifetime(d time.Duration) Option {
	return func(v *Verifier) {
		if d > 0 {
			v.maxLife = d
		}
	}
}

// TierSigners names the signers whose tokens may assert a shopper's
// tier (the tier claim): a sale's access rule lets a tier in, so a tier
// is only believed from a signer the operator trusts to vouch for
// people. A tier claim in any other token is ignored (Principal.Tier is
// 0), never refused: the token still identifies its user. The zero value
// trusts no signer.
type TierSigners struct {
	Secret     bool // the HS256 secret (FLASHSALE_JWT_SECRET)
	PublicKeys bool // the PEM public keys (WithPublicKey)
	JWKS       bool // the keys of the identity provider's JWK Set (WithJWKS)
}

// Names of the signers in the FLASHSALE_JWT_TIER_SIGNERS list.
const (
	SignerSecret     = "secret"
	SignerPublicKeys = "public-keys"
	SignerJWKS       = "jwks"
)

// ParseTierSigners reads a list of signer names (SignerSecret,
// SignerPublicKeys, SignerJWKS; "none" or nothing for none).
func ParseTierSigners(names []string) (TierSigners, error) {
	var t TierSigners
	for _, n := range names {
		switch n {
		case SignerSecret:
			t.Secret = true
		case SignerPublicKeys:
			t.PublicKeys = true
		case SignerJWKS:
			t.JWKS = true
		case "none", "":
		default:
			return TierSigners{}, fmt.Errorf("unknown signer %q: want %s, %s or %s", n, SignerSecret, SignerPublicKeys, SignerJWKS)
		}
	}
	return t, nil
}

// WithTierSigners trusts the tier claims of tokens signed by t's signers.
func WithTierSigners(t TierSigners) Option { return func(v *Verifier) { v.tier = t } }

// WithClock injects the clock used for exp and nbf.
func WithClock(now func() time.Time) Option { return func(v *Verifier) { v.now = now } }

// NewVerifier returns a verifier for HS256 tokens keyed with secret.
func NewVerifier(secret string, opts ...Option) *Verifier {
	v := &Verifier{hmacKey: []byte(secret), now: time.Now, maxLife: DefaultMaxLifetime}
	for _, o := range opts {
		o(v)
	}
	v.hs256.New = v.newHS256State
	algs := []string{"HS256"}
	if len(v.pubKeys) > 0 || v.jwks != nil {
		algs = append(algs, "RS256", "RS384", "RS512", "ES256", "ES384", "EdDSA", "PS256")
	}
	v.parser = jwt.NewParser(jwt.WithValidMethods(algs), jwt.WithExpirationRequired(),
		jwt.WithTimeFunc(func() time.Time { return v.now() }), jwt.WithLeeway(leeway))
	return v
}

// Claims are the access-token claims flashsale reads.
type Claims struct {
	Role string `json:"role,omitempty"`
	// IdentityKey (idk) is the shop's key for the person behind the
	// account (its hash of a card, an address or a phone): a sale's queue
	// holds one place per key.
	IdentityKey string `json:"idk,omitempty"`
	// Risk is the shop's risk score of the session, 0 to 1 (a token with
	// one outside is refused): the bot defense may shadow joins above a
	// threshold.
	Risk *float64 `json:"risk,omitempty"`
	// Tier is the shopper's tier, 1 (first) to flashsale.MaxTier, as its
	// signer asserts it; anything else (a string, 0, a fraction) is no
	// tier. Raw, so a foreign token's odd tier costs it nothing else.
	Tier json.RawMessage `json:"tier,omitempty"`
	jwt.RegisteredClaims
}

// MaxIdentityKeyLen bounds the idk claim: a token with a longer one is
// refused (a hash fits many times over).
const MaxIdentityKeyLen = 128

var errUnauthenticated = &flashsale.Error{Code: flashsale.CodeUnauthenticated, Message: "missing, invalid or expired access token"}

// ErrUnauthenticated is the error of every refused access token.
func ErrUnauthenticated() error { return errUnauthenticated }

// Verify returns the principal of a valid token. Any problem is
// UNAUTHENTICATED (the details are not shown to the caller).
func (v *Verifier) Verify(token string) (flashsale.Principal, error) {
	p, _, err := v.verify(token)
	return p, err
}

// generation changes when the public keys change in a way that may refuse
// a token accepted before (a JWKS fetch removed or replaced a key).
func (v *Verifier) generation() uint64 {
	if v.jwks == nil {
		return 0
	}
	return v.jwks.generation()
}

// verify also returns when the token expires (with the parser's leeway).
func (v *Verifier) verify(token string) (flashsale.Principal, time.Time, error) {
	if token == "" || len(token) > MaxTokenLen {
		return flashsale.Principal{}, time.Time{}, errUnauthenticated
	}
	switch p, exp, vd := v.verifyHS256(token); vd {
	case accept:
		return p, exp, nil
	case refuse:
		return flashsale.Principal{}, time.Time{}, errUnauthenticated
	}
	return v.verifyJWT(token)
}

// verifyJWT is verify through golang-jwt, for every token verifyHS256
// does not decide.
func (v *Verifier) verifyJWT(token string) (flashsale.Principal, time.Time, error) {
	var c Claims
	t, err := v.parser.ParseWithClaims(token, &c, v.key)
	if err != nil || c.ExpiresAt == nil {
		return flashsale.Principal{}, time.Time{}, errUnauthenticated
	}
	if _, hmac := t.Method.(*jwt.SigningMethodHMAC); !hmac {
		if v.issuer != "" && c.Issuer != v.issuer {
			return flashsale.Principal{}, time.Time{}, errUnauthenticated
		}
		if v.audience != "" && !slices.Contains(c.Audience, v.audience) {
			return flashsale.Principal{}, time.Time{}, errUnauthenticated
		}
	}
	cl := claims{exp: c.ExpiresAt.Time, hasExp: true, operator: c.Role == "operator", idk: c.IdentityKey}
	if c.Risk != nil {
		if !(*c.Risk >= 0 && *c.Risk <= 1) {
			return flashsale.Principal{}, time.Time{}, errUnauthenticated
		}
		cl.risk = *c.Risk
	}
	if tier := parseTier(c.Tier); tier != 0 && v.tierTrusted(t, token) {
		cl.tier = tier
	}
	cl.sub, _ = parseSubject(c.Subject)
	if c.IssuedAt != nil {
		cl.iat, cl.hasIat = c.IssuedAt.Time, true
	}
	if c.NotBefore != nil {
		cl.nbf, cl.hasNbf = c.NotBefore.Time, true
	}
	return v.admit(cl)
}

// claims are the claims verify reads, from either path.
type claims struct {
	sub           int64  // 0 unless sub is a user id (parseSubject)
	operator      bool   // role is "operator"
	idk           string // the identity key, "" for none
	risk          float64
	tier          int // a trusted tier claim, 0 for none
	exp, iat, nbf time.Time
	hasExp        bool
	hasIat        bool
	hasNbf        bool
}

// admit applies verify's rules to a signed token's claims: exp required,
// exp and nbf with the leeway (as the golang-jwt parser checks them), the
// lifetime cap from iat and from now, a user id as sub.
func (v *Verifier) admit(c claims) (flashsale.Principal, time.Time, error) {
	now := v.now()
	if !c.hasExp || !now.Before(c.exp.Add(leeway)) || c.hasNbf && now.Before(c.nbf.Add(-leeway)) {
		return flashsale.Principal{}, time.Time{}, errUnauthenticated
	}
	if c.exp.Sub(now) > v.maxLife+leeway || c.hasIat && c.exp.Sub(c.iat) > v.maxLife+leeway {
		return flashsale.Principal{}, time.Time{}, errUnauthenticated
	}
	if c.sub <= 0 || len(c.idk) > MaxIdentityKeyLen {
		return flashsale.Principal{}, time.Time{}, errUnauthenticated
	}
	return flashsale.Principal{UserID: c.sub, Operator: c.operator, IdentityKey: c.idk, Risk: c.risk, Tier: c.tier}, c.exp.Add(leeway), nil
}

// parseTier reads a tier claim: an integer 1 to flashsale.MaxTier, 0 for
// anything else.
func parseTier(raw json.RawMessage) int {
	if len(raw) != 1 || raw[0] < '1' || raw[0] > '0'+flashsale.MaxTier {
		return 0
	}
	return int(raw[0] - '0')
}

// tierTrusted reports whether the signer of t, a token verified by
// verifyJWT, is trusted to assert a tier. An asymmetric token's signature
// is checked again against the trusted keys alone: the key set it was
// verified with mixes the PEM keys and the JWK Set's, and a kid names a
// key without proving which one signed.
func (v *Verifier) tierTrusted(t *jwt.Token, token string) bool {
	if _, hmac := t.Method.(*jwt.SigningMethodHMAC); hmac {
		return v.tier.Secret
	}
	if !v.tier.PublicKeys && !v.tier.JWKS {
		return false
	}
	dot := strings.LastIndexByte(token, '.')
	if dot < 0 {
		return false
	}
	signed := token[:dot]
	verifies := func(key any) bool { return t.Method.Verify(signed, t.Signature, key) == nil }
	if v.tier.PublicKeys {
		for _, k := range v.pubKeys {
			if verifies(k) {
				return true
			}
		}
	}
	if v.tier.JWKS && v.jwks != nil {
		switch k, _ := v.jwks.key(t); k := k.(type) {
		case nil:
		case jwt.VerificationKeySet:
			for _, kk := range k.Keys {
				if verifies(kk) {
					return true
				}
			}
		default:
			return verifies(k)
		}
	}
	return false
}

// parseSubject reads a user id from sub: canonical decimal only (no sign,
// no leading zero, no space), so that one user has one sub and a user id
// compared or logged as text means one user.
func parseSubject[S string | []byte](sub S) (int64, bool) {
	if len(sub) == 0 || len(sub) > 19 || sub[0] == '0' {
		return 0, false
	}
	var n uint64 // 19 digits fit
	for i := 0; i < len(sub); i++ {
		if sub[i] < '0' || sub[i] > '9' {
			return 0, false
		}
		n = n*10 + uint64(sub[i]-'0')
	}
	if n > math.MaxInt64 {
		return 0, false
	}
	return int64(n), true
}

func (v *Verifier) key(t *jwt.Token) (any, error) {
	switch t.Method.(type) {
	case *jwt.SigningMethodHMAC:
		if len(v.hmacKey) == 0 {
			return nil, errors.New("no HMAC key configured")
		}
		return v.hmacKey, nil
	default:
		var keys []jwt.VerificationKey
		if v.jwks != nil {
			// A kid the set does not hold starts a (rate-limited) fetch;
			// without a kid every key of the set is tried.
			switch k, err := v.jwks.key(t); k := k.(type) {
			case jwt.VerificationKeySet:
				keys = append(keys, k.Keys...)
			case nil:
				if len(v.pubKeys) == 0 {
					return nil, err
				}
			default:
				keys = append(keys, k)
			}
		}
		for _, k := range v.pubKeys {
			keys = append(keys, k)
		}
		if len(keys) == 0 {
			return nil, errors.New("no public key configured")
		}
		return jwt.VerificationKeySet{Keys: keys}, nil
	}
}

// Mint signs an HS256 access token for userID (for development, tests and
// `flashsale token`).
func Mint(secret string, userID int64, operator bool, ttl time.Duration, now time.Time) (string, error) {
	return MintIdentity(secret, userID, operator, "", ttl, now)
}

// MintIdentity is Mint with an identity key (the idk claim; "" for none),
// as a shop's token for a person it has identified.
func MintIdentity(secret string, userID int64, operator bool, idk string, ttl time.Duration, now time.Time) (string, error) {
	return MintWith(secret, userID, MintOptions{Operator: operator, IdentityKey: idk}, ttl, now)
}

// MintTier is MintIdentity with a tier claim (0 for none), as a shop's
// token for a member.
func MintTier(secret string, userID int64, operator bool, idk string, tier int, ttl time.Duration, now time.Time) (string, error) {
	return MintWith(secret, userID, MintOptions{Operator: operator, IdentityKey: idk, Tier: tier}, ttl, now)
}

// MintOptions are a minted token's optional claims.
type MintOptions struct {
	Operator    bool
	IdentityKey string   // the idk claim ("" none)
	Risk        *float64 // the risk claim (nil none)
	Tier        int      // the tier claim (0 none)
}

// MintWith is Mint with the optional claims of o.
func MintWith(secret string, userID int64, o MintOptions, ttl time.Duration, now time.Time) (string, error) {
	c := Claims{IdentityKey: o.IdentityKey, Risk: o.Risk, RegisteredClaims: jwt.RegisteredClaims{
		Subject:   strconv.FormatInt(userID, 10),
		IssuedAt:  jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
	}}
	if o.Operator {
		c.Role = "operator"
	}
	if o.Tier != 0 {
		c.Tier = json.RawMessage(strconv.Itoa(o.Tier))
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SignedString([]byte(secret))
	if err != nil {
		return "", fmt.Errorf("auth.Mint: %w", err)
	}
	return s, nil
}
