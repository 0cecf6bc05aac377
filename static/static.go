// Package static holds the shopper page and the operator console: plain
// HTML, CSS and JavaScript embedded in the binary and prepared once for a CDN.
//
// New reads the embedded files, gives every asset a content-hashed name
// (/assets/app.3f2a9c1e.js), rewrites the references to it in the pages and
// in the other assets, precompresses the text files with gzip and computes
// strong ETags. Lookup maps a request path to a prepared File; the gateway
// writes its headers and body and needs nothing else from this package.
//
// Nothing here is user-specific or secret: the access token reaches the page
// in the URL fragment or sessionStorage (see README.md), and purchase URLs only
// ever come from the waiting room's "admitted" message.
package static

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"sort"
	"strings"
)

// Cache-Control values. Hashed assets never change under their name; pages
// and unhashed asset names may change with every deploy, so a CDN keeps them
// for a minute and then revalidates with the ETag.
const (
	CacheImmutable = "public, max-age=31536000, immutable"
	CacheShort     = "public, max-age=60"
)

//go:embed site/*.html site/assets/*.js site/assets/*.css site/assets/*.svg
var embedded embed.FS

// File is one prepared response body.
type File struct {
	// Body is the identity representation.
	Body []byte
	// Gzip is Body compressed with gzip, or nil when compression does not
	// make it smaller (serve Body then). Send it only to clients whose
	// Accept-Encoding allows gzip, with "Content-Encoding: gzip" and
	// "Vary: Accept-Encoding".
	Gzip []byte
	// ContentType is the full Content-Type header value.
	ContentType string
	// ETag is the strong entity tag of Body, quotes included.
	ETag string
	// GzipETag is the strong entity tag of Gzip, quotes included (a strong
	// tag names one exact byte sequence, so the two representations differ).
	GzipETag string
	// CacheControl is the Cache-Control header value.
	CacheControl string
}

// Site is the prepared set of pages and assets. It is immutable after New
// and safe for concurrent use.
type Site struct {
	shopper  File
	operator File
	// assets maps a name under /assets/ (hashed or not) to its file.
	assets map[string]File
	// hashed maps an asset's source name to its hashed name.
	hashed map[string]string
}

// New reads the embedded files once and prepares them.
func New() (*Site, error) {
	sub, err := fs.Sub(embedded, "site")
	if err != nil {
		return nil, fmt.Errorf("static.New: %w", err)
	}
	return build(sub)
}

// build prepares the site from a file tree holding *.html at its root and the
// assets under assets/.
func build(fsys fs.FS) (*Site, error) {
	src := map[string][]byte{} // asset name → content
	names, err := fs.Glob(fsys, "assets/*")
	if err != nil {
		return nil, fmt.Errorf("static.New: %w", err)
	}
	for _, n := range names {
		b, err := fs.ReadFile(fsys, n)
		if err != nil {
			return nil, fmt.Errorf("static.New: %w", err)
		}
		src[path.Base(n)] = b
	}
	order, err := dependencyOrder(src)
	if err != nil {
		return nil, fmt.Errorf("static.New: %w", err)
	}

	s := &Site{assets: map[string]File{}, hashed: map[string]string{}}
	for _, name := range order {
		body := rewriteRefs(src[name], s.hashed)
		sum := sha256.Sum256(body)
		hname := hashedName(name, hex.EncodeToString(sum[:4]))
		s.hashed[name] = hname
		f, err := prepare(name, body, CacheImmutable)
		if err != nil {
			return nil, fmt.Errorf("static.New: %s: %w", name, err)
		}
		s.assets[hname] = f
		f.CacheControl = CacheShort
		s.assets[name] = f
	}

	for _, page := range []struct {
		file string
		dst  *File
	}{{"index.html", &s.shopper}, {"operator.html", &s.operator}} {
		b, err := fs.ReadFile(fsys, page.file)
		if err != nil {
			return nil, fmt.Errorf("static.New: %w", err)
		}
		f, err := prepare(page.file, rewriteRefs(b, s.hashed), CacheShort)
		if err != nil {
			return nil, fmt.Errorf("static.New: %s: %w", page.file, err)
		}
		*page.dst = f
	}
	return s, nil
}

// Lookup returns the file for a request path: "/" and "/sales/{digits}" are
// the shopper page, "/operator" the console, "/assets/<name>" an asset by its
// hashed name (cached for a year) or its plain name (cached briefly).
func (s *Site) Lookup(p string) (File, bool) {
	switch {
	case p == "/":
		return s.shopper, true
	case p == "/operator":
		return s.operator, true
	case strings.HasPrefix(p, "/sales/"):
		if isDigits(strings.TrimPrefix(p, "/sales/")) {
			return s.shopper, true
		}
	case strings.HasPrefix(p, "/assets/"):
		f, ok := s.assets[strings.TrimPrefix(p, "/assets/")]
		return f, ok
	}
	return File{}, false
}

// AssetPath returns the hashed path of an asset by its source name, such as
// "app.js" → "/assets/app.3f2a9c1e.js" (for tests and preload headers).
func (s *Site) AssetPath(name string) (string, bool) {
	h, ok := s.hashed[name]
	if !ok {
		return "", false
	}
	return "/assets/" + h, true
}

func isDigits(s string) bool {
	if s == "" || len(s) > 19 {
		return false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// hashedName inserts the hash before the extension: app.js → app.<h>.js.
func hashedName(name, h string) string {
	ext := path.Ext(name)
	return strings.TrimSuffix(name, ext) + "." + h + ext
}

// refForms are the ways a page or an asset refers to an asset: by absolute
// path in HTML (src="/assets/app.js") and by relative module specifier in
// JavaScript (import ... from "./clock.js", new URL("./pow-worker.js", ...)).
func refForms(name string) []string {
	var out []string
	for _, q := range []string{`"`, `'`} {
		out = append(out, q+"/assets/"+name+q, q+"./"+name+q)
	}
	return out
}

// rewriteRefs replaces every quoted reference to an already hashed asset.
func rewriteRefs(b []byte, hashed map[string]string) []byte {
	for name, h := range hashed {
		for _, form := range refForms(name) {
			repl := strings.Replace(form, name, h, 1)
			b = bytes.ReplaceAll(b, []byte(form), []byte(repl))
		}
	}
	return b
}

// dependencyOrder sorts the assets so that each comes after every asset it
// refers to; the hash of a file then covers the hashed names of its
// dependencies. A cycle is an error.
func dependencyOrder(src map[string][]byte) ([]string, error) {
	names := make([]string, 0, len(src))
	for n := range src {
		names = append(names, n)
	}
	sort.Strings(names)
	deps := map[string][]string{}
	for _, n := range names {
		for _, d := range names {
			if d == n {
				continue
			}
			for _, form := range refForms(d) {
				if bytes.Contains(src[n], []byte(form)) {
					deps[n] = append(deps[n], d)
					break
				}
			}
		}
	}
	const (
		unseen = iota
		visiting
		done
	)
	state := map[string]int{}
	var order []string
	var visit func(n string, trail []string) error
	visit = func(n string, trail []string) error {
		switch state[n] {
		case done:
			return nil
		case visiting:
			return fmt.Errorf("asset reference cycle: %s", strings.Join(append(trail, n), " → "))
		}
		state[n] = visiting
		for _, d := range deps[n] {
			if err := visit(d, append(slices.Clone(trail), n)); err != nil {
				return err
			}
		}
		state[n] = done
		order = append(order, n)
		return nil
	}
	for _, n := range names {
		if err := visit(n, nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}

var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
	".json": "application/json",
}

func prepare(name string, body []byte, cache string) (File, error) {
	ct, ok := contentTypes[path.Ext(name)]
	if !ok {
		return File{}, fmt.Errorf("no content type for %q", name)
	}
	f := File{Body: body, ContentType: ct, ETag: etag(body), CacheControl: cache}
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return File{}, err
	}
	if _, err := zw.Write(body); err != nil {
		return File{}, err
	}
	if err := zw.Close(); err != nil {
		return File{}, err
	}
	if buf.Len() < len(body) {
		f.Gzip = buf.Bytes()
		f.GzipETag = etag(f.Gzip)
	}
	return f, nil
}

// etag is a strong entity tag: the first 16 bytes of the SHA-256, in hex.
func etag(b []byte) string {
	sum := sha256.Sum256(b)
	return `"` + hex.EncodeToString(sum[:16]) + `"`
}
