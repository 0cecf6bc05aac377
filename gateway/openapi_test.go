package gateway

import (
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/pb33f/libopenapi"
	"github.com/prometheus/client_golang/prometheus"
)

// openAPIFile is the API description the routes are checked against.
const openAPIFile = "../docs/openapi.yaml"

// wildcardPaths names the router's wildcard routes the way the file does:
// OpenAPI has no catch-all path parameter, so `*` is documented as a
// named parameter.
var wildcardPaths = map[string]string{
	"/assets/*": "/assets/{asset}",
}

// adminOnlyUndocumented are admin-port routes the file leaves out: Go's
// profiler, documented by the Go project, not an API of flashsale.
var adminOnlyUndocumented = []string{"/debug/pprof/"}

// adminRoutes are the routes AdminHandler serves besides the profiler; an
// http.ServeMux cannot list its patterns, so they are named here.
var adminRoutes = []string{"GET /metrics", "GET /healthz", "GET /readyz"}

var fiberParam = regexp.MustCompile(`:([A-Za-z0-9_]+)`)

// openAPIRoutes reads the file and returns its operations as "METHOD
// /path", split by server: paths that name their own servers are the admin
// port's, every other path is the public listener's.
func openAPIRoutes(t *testing.T) (public, admin map[string]bool) {
	t.Helper()
	spec, err := os.ReadFile(openAPIFile)
	if err != nil {
		t.Fatalf("read %s: %v", openAPIFile, err)
	}
	doc, err := libopenapi.NewDocument(spec)
	if err != nil {
		t.Fatalf("parse %s: %v", openAPIFile, err)
	}
	model, err := doc.BuildV3Model()
	if err != nil {
		t.Fatalf("build %s: %v", openAPIFile, err)
	}
	public, admin = map[string]bool{}, map[string]bool{}
	for path, item := range model.Model.Paths.PathItems.FromOldest() {
		set := public
		if len(item.Servers) > 0 {
			set = admin
		}
		ops := item.GetOperations()
		if ops.Len() == 0 {
			t.Errorf("%s: path without operations", path)
		}
		for method := range ops.KeysFromOldest() {
			set[strings.ToUpper(method)+" "+path] = true
		}
	}
	return public, admin
}

// routerRoutes lists the fiber app's routes as "METHOD /path" with
// `:param` written `{param}`. HEAD routes are left out: fiber registers
// one beside every GET, and the file documents the GET.
func routerRoutes(t *testing.T, s *Server) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, r := range s.App().GetRoutes(true) {
		if r.Method == http.MethodHead {
			continue
		}
		path := r.Path
		if strings.Contains(path, "*") {
			named, ok := wildcardPaths[path]
			if !ok {
				t.Errorf("%s %s: wildcard route without a name in wildcardPaths", r.Method, path)
				continue
			}
			path = named
		}
		out[r.Method+" "+fiberParam.ReplaceAllString(path, "{$1}")] = true
	}
	return out
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestOpenAPIRoutes keeps docs/openapi.yaml and the router in step: every
// route of the public port is documented, every documented public
// operation is routed, and every documented admin-port operation is
// served by AdminHandler.
func TestOpenAPIRoutes(t *testing.T) {
	public, admin := openAPIRoutes(t)
	routed := routerRoutes(t, New(Config{}, Deps{}))
	if len(routed) == 0 {
		t.Fatal("the router lists no routes")
	}
	for _, r := range sortedKeys(routed) {
		if !public[r] {
			t.Errorf("route %s is not in %s", r, openAPIFile)
		}
	}
	for _, r := range sortedKeys(public) {
		if !routed[r] {
			t.Errorf("%s documents %s, which the router does not have", openAPIFile, r)
		}
	}

	h := AdminHandler(prometheus.NewRegistry(), nil)
	for _, r := range sortedKeys(admin) {
		method, path, _ := strings.Cut(r, " ")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(method, path, nil))
		if w.Code == http.StatusNotFound || w.Code == http.StatusMethodNotAllowed {
			t.Errorf("%s documents admin route %s; AdminHandler answers %d", openAPIFile, r, w.Code)
		}
	}
	for _, r := range adminRoutes {
		if !admin[r] {
			t.Errorf("admin route %s is not in %s (as a path with the admin server)", r, openAPIFile)
		}
	}
	for _, p := range adminOnlyUndocumented {
		for r := range admin {
			if strings.Contains(r, " "+p) {
				t.Errorf("%s documents %s, listed as left out", openAPIFile, r)
			}
		}
	}
}
