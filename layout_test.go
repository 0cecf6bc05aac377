package flashsale_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/flashsale/flashsale"

// imports is what a package may import of the module: code lists the
// packages its own files may import; tests lists the ones its test files
// may import besides (a package's external tests may always import the
// package itself). Names are paths inside the module, "flashsale" for the
// root. Lists are separated by spaces.
type imports struct{ code, tests string }

// layout is every package of the module and the imports it may make. A
// package missing here, or an import its entry does not allow, fails
// TestLayout: a new edge between packages is a decision, taken here and
// stated in the package docs.
//
// Components (admission, auth, defense, expiry, gateway, purchase,
// waitroom, writer) share the root's types and talk through Redis and
// Kafka; they import each other only where a comment says why. Tests
// import more freely: the harness (internal/testenv, internal/localsvc,
// internal/salestest, internal/app/apptest) and the parts a test drives
// beside the package under test.
var layout = map[string]imports{
	// The root imports nothing of the module; lua and static are leaves.
	"flashsale": {},
	"lua":       {},
	"static":    {},

	// Components.
	"admission": {code: "flashsale"},
	"auth":      {code: "flashsale"},
	"defense":   {code: "flashsale internal/prom lua", tests: "internal/testenv"},
	"expiry": {code: "flashsale internal/prom internal/stock",
		tests: "internal/orders internal/sales internal/salestest internal/testenv"},
	// The gateway's Guard interface speaks defense's counters and route
	// classes; its tests mint the tokens the edge verifies.
	"gateway": {code: "flashsale defense internal/prom", tests: "admission auth"},
	"purchase": {code: "flashsale internal/prom internal/stock",
		tests: "internal/kafka internal/sales internal/salestest internal/testenv"},
	// The waiting room signs the admission tokens it hands out.
	"waitroom": {code: "flashsale admission internal/prom lua",
		tests: "auth internal/localsvc internal/testenv"},
	// The writer's tests reserve and publish through purchase, the
	// writer's upstream.
	"writer": {code: "flashsale internal/prom internal/stock",
		tests: "lua purchase internal/kafka internal/localsvc internal/postgres internal/sales internal/salestest internal/testenv"},

	// Adapters and services shared by the components.
	// prom registers every component's collectors: one rule for a
	// metric registered twice.
	"internal/prom":     {},
	"internal/kafka":    {code: "flashsale", tests: "internal/testenv"},
	"internal/postgres": {tests: "internal/localsvc internal/testenv"},
	"internal/stock":    {code: "flashsale lua", tests: "internal/testenv"},
	"internal/sales":    {code: "flashsale internal/stock lua", tests: "internal/testenv"},
	"internal/orders": {code: "flashsale internal/postgres internal/stock",
		tests: "internal/sales internal/salestest internal/testenv"},

	// The composition root and the binary.
	"internal/app": {code: "flashsale admission auth defense expiry gateway purchase static waitroom writer internal/kafka internal/orders internal/postgres internal/prom internal/sales internal/stock",
		tests: "internal/app/apptest internal/localsvc internal/testenv"},
	"cmd/flashsale": {code: "flashsale auth waitroom internal/app internal/benchhttp internal/localsvc internal/postgres internal/sales internal/stock loadtest",
		tests: "internal/app/apptest internal/testenv"},

	// Tools that drive a stack from outside. The load harness mints access
	// tokens, solves the proof of work and warns against the waiting room's
	// per-address connection cap.
	"loadtest":           {code: "flashsale auth defense waitroom", tests: "internal/localsvc internal/postgres"},
	"loadtest/e2e":       {tests: "internal/app internal/testenv loadtest"},
	"browsertest":        {tests: "static internal/app internal/app/apptest internal/testenv"},
	"internal/benchhttp": {code: "flashsale admission auth gateway internal/app internal/localsvc internal/postgres internal/stock"},

	// The test harness.
	"internal/localsvc":    {},
	"internal/testenv":     {code: "flashsale internal/localsvc internal/postgres"},
	"internal/salestest":   {code: "flashsale internal/sales"},
	"internal/app/apptest": {code: "auth internal/app internal/testenv"},
}

// confined are outside modules that only the listed packages may import
// (code, and tests besides). fiber is the edge's framework and stays in the
// gateway. franz-go serves the Kafka adapter, the writer's consumer, the
// composition root's broker check and embedded broker, and the harness's
// broker (kfake); the purchase and cmd/flashsale tests read and write
// topics with it.
var confined = []struct {
	prefix      string
	code, tests string
}{
	{prefix: "github.com/gofiber/", code: "gateway"},
	{prefix: "github.com/twmb/franz-go/", code: "internal/kafka internal/app internal/testenv writer",
		tests: "purchase cmd/flashsale"},
}

// TestLayout checks every import of every package of the module, tests
// included, against layout and confined.
func TestLayout(t *testing.T) {
	listed := make(map[string]bool)
	for _, p := range listPackages(t) {
		name := inModule(p.ImportPath)
		listed[name] = true
		t.Run(name, func(t *testing.T) {
			allowed, ok := layout[name]
			if !ok {
				t.Fatalf("%s is not in the layout (layout_test.go): add it with the imports it may make", name)
			}
			code := words(allowed.code)
			tests := words(allowed.code, allowed.tests, name)
			for _, imp := range p.Imports {
				checkImport(t, name, imp, code, false)
			}
			for _, imp := range append(p.TestImports, p.XTestImports...) {
				checkImport(t, name, imp, tests, true)
			}
		})
	}
	for name := range layout {
		if !listed[name] {
			t.Errorf("the layout (layout_test.go) lists %s, which is no package of the module", name)
		}
	}
}

// checkImport reports imp, imported by the package name (in its tests when
// test is true), when the layout does not allow it.
func checkImport(t *testing.T, name, imp string, allowed map[string]bool, test bool) {
	t.Helper()
	where := ""
	if test {
		where = " (tests)"
	}
	if imp == module || strings.HasPrefix(imp, module+"/") {
		if !allowed[inModule(imp)] {
			t.Errorf("%s%s imports %s, which the layout (layout_test.go) does not allow", name, where, imp)
		}
		return
	}
	for _, c := range confined {
		if !strings.HasPrefix(imp, c.prefix) {
			continue
		}
		users := words(c.code)
		if test {
			users = words(c.code, c.tests)
		}
		if !users[name] {
			t.Errorf("%s%s imports %s, which only %s may import (layout_test.go)", name, where, imp, strings.Join(strings.Fields(c.code+" "+c.tests), ", "))
		}
	}
}

type listedPackage struct {
	ImportPath                         string
	Imports, TestImports, XTestImports []string
}

// listPackages is `go list` of every package of the module.
func listPackages(t *testing.T) []listedPackage {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,TestImports,XTestImports", module+"/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	var pkgs []listedPackage
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p listedPackage
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("go list: decoding its output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 {
		t.Fatal("go list found no package")
	}
	return pkgs
}

// inModule is a package's path inside the module, "flashsale" for the root.
func inModule(importPath string) string {
	if importPath == module {
		return "flashsale"
	}
	return strings.TrimPrefix(importPath, module+"/")
}

// words is the set of the space-separated names in lists.
func words(lists ...string) map[string]bool {
	set := make(map[string]bool)
	for _, l := range lists {
		for _, w := range strings.Fields(l) {
			set[w] = true
		}
	}
	return set
}
