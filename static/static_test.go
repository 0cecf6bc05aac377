package static

import (
	"bytes"
	"compress/gzip"
	"io"
	"io/fs"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"
)

func newSite(t *testing.T) *Site {
	t.Helper()
	s, err := New()
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

func TestLookupRoutes(t *testing.T) {
	s := newSite(t)
	app, ok := s.AssetPath("app.js")
	if !ok {
		t.Fatal("no hashed path for app.js")
	}
	css, _ := s.AssetPath("style.css")
	tests := []struct {
		name, path, contentType, cache, contains string
	}{
		{"home", "/", "text/html; charset=utf-8", CacheShort, `id="sales"`},
		{"sale", "/sales/7", "text/html; charset=utf-8", CacheShort, `id="countdown"`},
		{"big sale id", "/sales/9223372036854775807", "text/html; charset=utf-8", CacheShort, `id="queue-state"`},
		{"operator", "/operator", "text/html; charset=utf-8", CacheShort, `id="op-token"`},
		{"hashed js", app, "text/javascript; charset=utf-8", CacheImmutable, "QueueClient"},
		{"hashed css", css, "text/css; charset=utf-8", CacheImmutable, ":focus-visible"},
		{"plain js", "/assets/app.js", "text/javascript; charset=utf-8", CacheShort, "QueueClient"},
		{"plain worker", "/assets/pow-worker.js", "text/javascript; charset=utf-8", CacheShort, "onmessage"},
		{"demo picture", "/assets/sneaker.svg", "image/svg+xml", CacheShort, "<svg"},
		{"catalogue", "/assets/lang-es.js", "text/javascript; charset=utf-8", CacheShort, "Artículos"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, ok := s.Lookup(tc.path)
			if !ok {
				t.Fatalf("Lookup(%q) not found", tc.path)
			}
			if f.ContentType != tc.contentType {
				t.Errorf("ContentType = %q, want %q", f.ContentType, tc.contentType)
			}
			if f.CacheControl != tc.cache {
				t.Errorf("CacheControl = %q, want %q", f.CacheControl, tc.cache)
			}
			if !strings.Contains(string(f.Body), tc.contains) {
				t.Errorf("body lacks %q", tc.contains)
			}
			if !regexp.MustCompile(`^"[0-9a-f]{32}"$`).MatchString(f.ETag) {
				t.Errorf("ETag = %q, want a quoted strong tag", f.ETag)
			}
		})
	}
}

func TestLookupMisses(t *testing.T) {
	s := newSite(t)
	for _, p := range []string{"", "/index.html", "/sales/", "/sales/abc", "/sales/7/x", "/sales/-1", "/sales/99999999999999999999",
		"/operator/", "/operator/x", "/assets/", "/assets/nope.js", "/assets/app.00000000.js", "/assets/../static.go", "/static.go"} {
		if _, ok := s.Lookup(p); ok {
			t.Errorf("Lookup(%q) found, want miss", p)
		}
	}
}

func TestHashedNamesAndReferences(t *testing.T) {
	s := newSite(t)
	hashedRe := regexp.MustCompile(`^/assets/[a-z-]+\.[0-9a-f]{8}\.(js|css|svg)$`)
	for name := range s.hashed {
		p, _ := s.AssetPath(name)
		if !hashedRe.MatchString(p) {
			t.Errorf("AssetPath(%q) = %q, want /assets/<name>.<8 hex>.<ext>", name, p)
		}
	}
	// Every reference in the pages and assets is to a hashed name that
	// Lookup serves: HTML by absolute path, JavaScript by relative specifier.
	absRe := regexp.MustCompile(`["'](/assets/[^"']+)["']`)
	relRe := regexp.MustCompile(`["']\./([^"']+)["']`)
	check := func(from string, body []byte) {
		for _, m := range absRe.FindAllSubmatch(body, -1) {
			ref := string(m[1])
			if !hashedRe.MatchString(ref) {
				t.Errorf("%s refers to unhashed %s", from, ref)
			}
			if f, ok := s.Lookup(ref); !ok || f.CacheControl != CacheImmutable {
				t.Errorf("%s refers to %s: not served as immutable", from, ref)
			}
		}
		for _, m := range relRe.FindAllSubmatch(body, -1) {
			ref := "/assets/" + string(m[1])
			if !hashedRe.MatchString(ref) {
				t.Errorf("%s imports unhashed %s", from, ref)
			}
			if _, ok := s.Lookup(ref); !ok {
				t.Errorf("%s imports %s: not served", from, ref)
			}
		}
	}
	for _, p := range []string{"/", "/operator"} {
		f, _ := s.Lookup(p)
		check(p, f.Body)
		if !strings.Contains(string(f.Body), `src="/assets/`) {
			t.Errorf("%s has no script reference", p)
		}
	}
	for name := range s.hashed {
		f, _ := s.Lookup("/assets/" + name)
		check(name, f.Body)
	}
	// The worker is referenced from the queue module by its hashed name.
	q, _ := s.Lookup("/assets/queue.js")
	w, _ := s.AssetPath("pow-worker.js")
	if !strings.Contains(string(q.Body), "'./"+strings.TrimPrefix(w, "/assets/")+"'") {
		t.Errorf("queue.js does not load the worker by its hashed name %s", w)
	}
}

func TestGzipAndETags(t *testing.T) {
	s := newSite(t)
	paths := []string{"/", "/operator"}
	for name := range s.hashed {
		p, _ := s.AssetPath(name)
		paths = append(paths, p)
	}
	for _, p := range paths {
		f, _ := s.Lookup(p)
		if f.Gzip == nil {
			t.Errorf("%s: no gzip body", p)
			continue
		}
		zr, err := gzip.NewReader(bytes.NewReader(f.Gzip))
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		got, err := io.ReadAll(zr)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if !bytes.Equal(got, f.Body) {
			t.Errorf("%s: gzip body does not decompress to the body", p)
		}
		if f.GzipETag == "" || f.GzipETag == f.ETag {
			t.Errorf("%s: GzipETag = %q, want a tag distinct from %q", p, f.GzipETag, f.ETag)
		}
	}
	// Prepared the same way twice, everything is byte-identical: N gateways
	// behind one CDN agree on names and tags.
	s2 := newSite(t)
	for _, p := range paths {
		a, _ := s.Lookup(p)
		b, ok := s2.Lookup(p)
		if !ok || a.ETag != b.ETag || a.GzipETag != b.GzipETag {
			t.Errorf("%s: not deterministic", p)
		}
	}
	home, _ := s.Lookup("/")
	sale, _ := s.Lookup("/sales/1")
	if home.ETag != sale.ETag {
		t.Error("/ and /sales/1 should be the same page")
	}
}

// TestNoSecretsOrPurchaseURLs greps every embedded file: purchase URLs come
// only from the waiting room's admitted message, and nothing secret or
// user-specific is in a file a CDN caches.
func TestNoSecretsOrPurchaseURLs(t *testing.T) {
	forbidden := []string{
		"/purchase",            // purchase URLs come from the admitted message only
		"eyJ",                  // a JWT (base64 of `{"`)
		"BEGIN ",               // PEM keys
		"FLASHSALE_JWT_SECRET", // configuration
		"FLASHSALE_DATABASE",   // configuration
		"admissionToken\":\"",  // a literal admission token
		"localStorage",         // tokens live per tab in sessionStorage only (lang.js: see below)
		"document.cookie",      // no cookies
		"innerHTML",            // all text goes in with textContent
		"eval(",                // no dynamic code
		"new Function",         // no dynamic code
		"http://", "https://",  // no third-party or absolute URLs
	}
	err := fs.WalkDir(embedded, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(embedded, p)
		if err != nil {
			return err
		}
		for _, f := range forbidden {
			if f == "http://" && (strings.HasSuffix(p, ".js") || strings.HasSuffix(p, ".svg")) {
				// charts.js and the pictures name the SVG namespace, which is
				// not a URL that is fetched.
				b = bytes.ReplaceAll(b, []byte("http://www.w3.org/2000/svg"), nil)
			}
			if f == "localStorage" && p == "site/assets/lang.js" {
				// The language choice is the one thing kept across tabs:
				// lang.js reads and writes only its LANG_KEY.
				b = bytes.ReplaceAll(b, []byte("win.localStorage"), nil)
				b = bytes.ReplaceAll(b, []byte("One localStorage entry"), nil)
				b = bytes.ReplaceAll(b, []byte("the one localStorage entry"), nil)
			}
			if bytes.Contains(b, []byte(f)) {
				t.Errorf("%s contains %q", p, f)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestStableIDs(t *testing.T) {
	s := newSite(t)
	shop, _ := s.Lookup("/")
	op, _ := s.Lookup("/operator")
	app, _ := s.Lookup("/assets/app.js")
	for _, id := range []string{"countdown", "queue-state", "position", "eta", "progress", "result", "order-status", "pay", "cancel", "pay-deadline", "error", "pow-progress", "lang-switch", "sale-message"} {
		if !strings.Contains(string(shop.Body), `id="`+id+`"`) {
			t.Errorf("shopper page lacks #%s", id)
		}
	}
	if !strings.Contains(string(shop.Body), `aria-live="polite"`) {
		t.Error("shopper page lacks a polite live region")
	}
	if !strings.Contains(string(app.Body), "'buy-' + id") {
		t.Error("app.js does not create #buy-<itemId> buttons")
	}
	for _, id := range []string{"op-token", "sales-list", "create-sale", "rate-input", "rate-apply", "block-user-input", "block-user-apply", "block-cidr-input", "pow-difficulty", "audit-list", "figures",
		"lang-switch", "ctl-pause", "ctl-resume", "ctl-end", "ctl-end-yes", "stock-item", "stock-add", "stock-apply", "message-text", "message-apply", "conflict", "conflict-reload"} {
		if !strings.Contains(string(op.Body), `id="`+id+`"`) {
			t.Errorf("operator console lacks #%s", id)
		}
	}
	// No inline scripts or styles: the pages work under a strict CSP.
	for name, b := range map[string][]byte{"/": shop.Body, "/operator": op.Body} {
		if regexp.MustCompile(`<script(?:\s+type="module")?>|<style|\sstyle="|\son[a-z]+="`).Match(b) {
			t.Errorf("%s has inline script, style or event handler", name)
		}
	}
}

func TestBuildRejectsReferenceCycles(t *testing.T) {
	fsys := fstest.MapFS{
		"index.html":    {Data: []byte(`<script src="/assets/a.js"></script>`)},
		"operator.html": {Data: []byte(``)},
		"assets/a.js":   {Data: []byte(`import './b.js';`)},
		"assets/b.js":   {Data: []byte(`import './a.js';`)},
	}
	if _, err := build(fsys); err == nil || !strings.Contains(err.Error(), "cycle") {
		t.Fatalf("build with a cycle: err = %v, want a cycle error", err)
	}
}

func TestBuildHashesDependenciesFirst(t *testing.T) {
	mk := func(b string) fstest.MapFS {
		return fstest.MapFS{
			"index.html":    {Data: []byte(`<script type="module" src="/assets/a.js"></script>`)},
			"operator.html": {Data: []byte(`x`)},
			"assets/a.js":   {Data: []byte(`import { b } from './b.js';`)},
			"assets/b.js":   {Data: []byte(b)},
		}
	}
	s1, err := build(mk("export const b = 1;"))
	if err != nil {
		t.Fatal(err)
	}
	s2, err := build(mk("export const b = 2;"))
	if err != nil {
		t.Fatal(err)
	}
	a1, _ := s1.AssetPath("a.js")
	a2, _ := s2.AssetPath("a.js")
	if a1 == a2 {
		t.Errorf("a.js kept its name %s although its dependency changed", a1)
	}
	h1, _ := s1.Lookup("/")
	if !strings.Contains(string(h1.Body), a1) {
		t.Errorf("page does not refer to %s: %s", a1, h1.Body)
	}
}
