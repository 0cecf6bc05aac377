package flashsale_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
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
// The tree is sorted by kind (TestKinds): the root and the leaves lua and
// static; components at the top (access, admission, auth, defense, expiry,
// gateway, orders, purchase, reconcile, sales, waitroom, writer); adapters
// named after their dependency under internal/adapter; the connection
// plumbing of the public port under internal/conn; the composition root,
// internal/wiring; the harness of dev and tests under internal/harness;
// benchmark tooling under internal/bench. Components share the root's types
// and talk through Redis and Kafka; they import each other only where a
// comment says why. Tests import more freely: the harness, sales/salestest,
// internal/wiring/apptest and the parts a test drives beside the package
// under test.
var layout = map[string]imports{
	// The root imports nothing of the module; lua and static are leaves.
	"flashsale": {},
	"lua":       {},
	"static":    {},

	// Components.
	// access decides who may join a sale; its tests run the sale store
	// that moves a sale's version when the allowlist changes.
	"access":    {code: "flashsale internal/adapter/postgres", tests: "sales internal/adapter/redisstock internal/harness/testenv"},
	"admission": {code: "flashsale"},
	"auth":      {code: "flashsale", tests: "internal/harness/testenv"},
	// Every store behind the gateway answers its outages UNAVAILABLE with
	// the postgres adapter's Outage or Unavailable (defense's settings,
	// sales, the waiting room, orders).
	"defense": {code: "flashsale internal/adapter/postgres internal/adapter/prom lua", tests: "internal/harness/testenv"},
	// events is the order-event outbox: its Append writes in the caller's
	// transaction, its relay produces through the Kafka adapter's client.
	"events": {code: "flashsale internal/adapter/kafka internal/adapter/prom",
		tests: "internal/harness/testenv"},
	"expiry": {code: "flashsale internal/adapter/postgres/orderstore internal/adapter/prom internal/adapter/redisstock",
		tests: "orders sales sales/salestest internal/harness/testenv"},
	// The gateway's Guard interface speaks defense's counters and route
	// classes; its tests mint the tokens the edge verifies. Its public
	// port splits connections and watches their timeouts with
	// internal/conn.
	"gateway": {code: "flashsale defense internal/adapter/prom internal/conn/split internal/conn/watchdog", tests: "admission auth internal/harness/testenv"},
	// orders verifies the shop's payment callbacks with the HMAC header
	// events signs its webhooks with (one signature scheme).
	"orders": {code: "flashsale events internal/adapter/postgres internal/adapter/postgres/orderstore internal/adapter/redisstock",
		tests: "sales sales/salestest internal/harness/testenv"},
	// purchase's tests freeze and kill their own redis-server (localsvc).
	"purchase": {code: "flashsale internal/adapter/prom internal/adapter/redisstock",
		tests: "internal/adapter/kafka internal/adapter/redisconn sales sales/salestest internal/harness/localsvc internal/harness/testenv"},
	// reconcile settles what the purchase path leaves unsettled, through
	// Redis, PostgreSQL and Kafka only: it imports no component (kafka for
	// the type of a record read with its position, which a rebuild's
	// fence compares). Its tests
	// drive the purchase service and its placement Leaser beside it (a
	// reservation left uncertain, a gateway whose lease lapses); lua names
	// the stock key the rebuild's tests take items out of.
	"reconcile": {code: "flashsale internal/adapter/kafka internal/adapter/postgres/orderstore internal/adapter/prom internal/adapter/redisstock",
		tests: "lua purchase sales sales/salestest internal/harness/testenv"},
	// push sends the turn notifications the waiting room's leader
	// reports (through an interface of the room) and keeps the
	// subscriptions under lua's key, which the room expires with the
	// queue.
	"push": {code: "flashsale lua internal/adapter/prom", tests: "push/pushtest internal/harness/testenv"},
	// pushtest is a local push service written from the RFCs, not from
	// push's code, so that it checks it.
	"push/pushtest": {},
	"sales":         {code: "flashsale internal/adapter/postgres internal/adapter/postgres/orderstore internal/adapter/redisstock lua", tests: "internal/harness/testenv"},
	// The waiting room signs the admission tokens it hands out. Its
	// capacity cap asks the stock adapter (redisstock) for the
	// reservation counters and buyer records of every stock shard, so
	// that the keys of a sale's stock are named in one package; its
	// allocation tests hold through the real stock.
	"waitroom": {code: "flashsale admission internal/adapter/postgres internal/adapter/prom internal/adapter/redisstock internal/conn/gopool internal/conn/idlepoll lua",
		tests: "auth internal/harness/localsvc internal/harness/testenv"},
	// The writer's tests reserve and publish through purchase, the
	// writer's upstream, and settle what it leaves with reconcile. Its
	// consumer takes the brokers, TLS, SASL and
	// logger from the Kafka adapter, the one place they are built.
	"writer": {code: "flashsale internal/adapter/kafka internal/adapter/postgres/orderstore internal/adapter/prom internal/adapter/redisstock",
		tests: "lua purchase reconcile internal/adapter/kafka internal/adapter/postgres sales sales/salestest internal/harness/localsvc internal/harness/testenv"},

	// Adapters, named after their dependency. prom registers every
	// component's collectors: one rule for a metric registered twice.
	"internal/adapter/prom":  {},
	"internal/adapter/kafka": {code: "flashsale", tests: "internal/harness/testenv"},
	// postgres's Outage answers an outage with the root's UNAVAILABLE.
	"internal/adapter/postgres": {code: "flashsale", tests: "internal/harness/localsvc internal/harness/testenv"},
	// orderstore owns an order's rows: every status change, its event
	// and its stock return (TestTableOwners).
	"internal/adapter/postgres/orderstore": {code: "flashsale", tests: "internal/adapter/postgres internal/harness/testenv"},
	"internal/adapter/redisstock":          {code: "flashsale lua", tests: "internal/harness/testenv"},
	// redisclock reads the fleet's clock, Redis TIME.
	"internal/adapter/redisclock": {tests: "internal/harness/testenv"},
	// redisconn builds every Redis client from the settings (one node,
	// cluster, Sentinel); its tests start those topologies for real and
	// reserve through redisstock while a cluster node is down.
	"internal/adapter/redisconn": {tests: "lua internal/adapter/redisstock internal/harness/localsvc internal/harness/testenv"},

	// Connection plumbing of the public port: what happens to a TCP
	// connection before and around the HTTP server that reads it. It knows
	// no route and no type of flashsale, so it imports nothing of the
	// module but itself; split routes a connection by its first head,
	// watchdog enforces the timeouts of the connections given to fiber.
	// They do not know each other: the gateway hands one to the other.
	// gopool keeps goroutines from one connection's work to the next:
	// split's routing runs on it, and so do the waiting room's handshakes
	// and pings (its package doc says so). idlepoll tells the waiting room
	// when a joined connection has bytes to read.
	"internal/conn/split":    {code: "internal/conn/gopool", tests: "internal/harness/testenv"},
	"internal/conn/watchdog": {},
	"internal/conn/gopool":   {},
	"internal/conn/idlepoll": {tests: "internal/harness/testenv"},

	// The composition root and the binaries.
	"internal/wiring": {code: "flashsale access admission auth defense events expiry gateway orders purchase push reconcile sales static waitroom writer internal/adapter/kafka internal/adapter/postgres internal/adapter/prom internal/adapter/redisstock internal/adapter/redisconn internal/adapter/redisclock",
		// lua names the queue keys the Redis-loss tests mark, as the
		// leader marks them when it sees the stock lost.
		// pushtest is the push service the turn notifications are
		// decrypted by.
		tests: "lua push/pushtest internal/wiring/apptest internal/harness/localsvc internal/harness/testenv"},
	"cmd/flashsale": {code: "flashsale auth sales waitroom internal/wiring internal/harness/localsvc internal/adapter/postgres internal/adapter/redisstock internal/adapter/redisconn",
		tests: "internal/wiring/apptest internal/harness/testenv"},
	"cmd/flashsale-bench": {code: "internal/bench internal/wiring"},
	// The load harness's own binary, so the production one does not carry
	// it (notShipped).
	"cmd/flashsale-load": {code: "loadtest waitroom internal/wiring"},

	// Tools that drive a stack from outside. The load harness mints access
	// tokens, solves the proof of work and warns against the waiting room's
	// per-address connection cap; it counts Redis commands over a Redis
	// connected like the server's (redisconn).
	"loadtest":     {code: "flashsale auth defense waitroom internal/adapter/redisconn", tests: "internal/harness/localsvc internal/harness/testenv internal/adapter/postgres"},
	"loadtest/e2e": {tests: "internal/wiring internal/harness/testenv loadtest"},
	"browsertest":  {tests: "static push push/pushtest internal/wiring internal/wiring/apptest internal/harness/testenv"},
	// The HTTP benchmarks read a server's CPU as the load harness does.
	"internal/bench": {code: "flashsale admission auth gateway loadtest internal/wiring internal/harness/localsvc internal/adapter/postgres internal/adapter/redisstock internal/adapter/redisconn"},

	// The harness of dev and tests. localsvc is also in the binary, for
	// `flashsale dev`.
	"internal/harness/localsvc": {},
	"internal/harness/testenv":  {code: "flashsale internal/harness/localsvc internal/adapter/postgres internal/adapter/redisconn"},
	"sales/salestest":           {code: "flashsale sales"},
	"internal/wiring/apptest":   {code: "auth internal/wiring internal/harness/testenv"},
}

// kinds are the directories of internal/, one per kind of package. A
// package of internal/ outside them fails TestKinds. internal/conn/ holds
// connection plumbing: it speaks to no outside dependency (not an
// adapter) and does no job of a sale (not a component), but is in the
// production binary (not the harness or benchmark tooling).
var kinds = []string{"internal/adapter/", "internal/bench", "internal/conn/", "internal/harness/", "internal/wiring"}

// notShipped are packages that must not be in the production binary,
// cmd/flashsale, even through another package: benchmark tooling, the load
// harness (cmd/flashsale-load) and test helpers.
var notShipped = []string{"internal/bench", "loadtest", "internal/harness/testenv", "internal/wiring/apptest", "sales/salestest", "push/pushtest"}

// confined are outside modules that only the listed packages may import
// (code, and tests besides). fiber is the edge's framework and stays in the
// gateway. franz-go serves the Kafka adapter, the writer's consumer, the
// composition root's broker check and embedded broker, and the harness's
// broker (kfake); the purchase, reconcile and cmd/flashsale tests read and
// write topics with it. The events relay produces the order events and reads
// back what it produced (its exactly-once recovery).
var confined = []struct {
	prefix      string
	code, tests string
}{
	{prefix: "github.com/gofiber/", code: "gateway"},
	{prefix: "github.com/SherClockHolmes/", code: "push"},
	{prefix: "github.com/twmb/franz-go/", code: "internal/adapter/kafka internal/wiring internal/harness/testenv writer events",
		tests: "purchase reconcile cmd/flashsale"},
}

// TestKinds checks that every package of internal/ sits in the directory
// of its kind.
func TestKinds(t *testing.T) {
	for name := range layout {
		if !strings.HasPrefix(name, "internal/") {
			continue
		}
		ok := false
		for _, k := range kinds {
			ok = ok || name == strings.TrimSuffix(k, "/") || strings.HasPrefix(name, strings.TrimSuffix(k, "/")+"/")
		}
		if !ok {
			t.Errorf("%s is in no kind of internal/ (%s): see layout_test.go", name, strings.Join(kinds, ", "))
		}
	}
}

// TestNotShipped checks the production binary's dependencies, direct and
// indirect, for benchmark tooling, the load harness and test helpers.
func TestNotShipped(t *testing.T) {
	cmd := exec.Command("go", "list", "-deps", module+"/cmd/flashsale")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, stderr.Bytes())
	}
	deps := words(string(out))
	if !deps[module+"/internal/wiring"] {
		t.Fatalf("go list -deps of cmd/flashsale lists no internal/wiring: %s", out)
	}
	for _, p := range notShipped {
		if deps[module+"/"+p] {
			t.Errorf("cmd/flashsale depends on %s, which must not ship in the production binary", p)
		}
	}
}

// envReaders are the only files, besides tests, that read the environment
// (os.Getenv, os.LookupEnv): the configuration spec, whose FromEnv and
// LoadEnv every binary goes through, and the test helpers' switches
// (FLASHSALE_TEST_REDIS, FLASHSALE_TEST_LOG). A setting read anywhere else
// would be missing from the README's table and from `flashsale config`.
var envReaders = []string{"internal/wiring/settings.go", "internal/harness/testenv/testenv.go", "internal/wiring/apptest/apptest.go"}

// TestEnvOnlyInSpec fails when a file outside envReaders, tests aside,
// reads the environment.
func TestEnvOnlyInSpec(t *testing.T) {
	allowed := words(strings.Join(envReaders, " "))
	read := regexp.MustCompile(`\bos\.(Getenv|LookupEnv)\b`)
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules" || d.Name() == "out") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if read.Match(b) && !allowed[filepath.ToSlash(path)] {
			t.Errorf("%s reads the environment: declare the setting in internal/wiring/settings.go and read it from wiring.Config", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
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

// maxTestSleeps is how many time.Sleep calls the tests may make. A test
// that sleeps to wait for something fails when the machine is slower than
// the sleep; new tests wait with testenv.Eventually or advance an
// injected clock. The number only goes down: lower it when a sleep goes.
const maxTestSleeps = 7

// TestSleepsOnlyGoDown fails when the tests call time.Sleep more often
// than maxTestSleeps.
func TestSleepsOnlyGoDown(t *testing.T) {
	out, err := exec.Command("git", "grep", "-c", "time\\.Sleep(", "--", "*_test.go").Output()
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 1) { // 1: no match
		t.Skipf("git grep: %v (not a git checkout?)", err)
	}
	total := 0
	var per []string
	for line := range strings.Lines(string(out)) {
		file, n, ok := strings.Cut(strings.TrimSpace(line), ":")
		c, err := strconv.Atoi(n)
		if !ok || err != nil {
			t.Fatalf("git grep line %q", line)
		}
		total += c
		per = append(per, file+": "+n)
	}
	if total > maxTestSleeps {
		t.Fatalf("the tests call time.Sleep %d times, more than %d: wait with testenv.Eventually or an injected clock instead\n%s",
			total, maxTestSleeps, strings.Join(per, "\n"))
	}
}

// tableOwners are the tables whose SQL only the listed packages' code may
// write (tests are free to read and seed them). The order store owns an
// order's life: the orders, the stock-return outbox and the payments are
// named nowhere else. It writes every order event; the events package
// drains the event outbox (relay, webhook). The events package alone
// writes and drains the shopper-event outbox (the leader's turns, for the
// webhook). The sale store owns its stock
// additions and their outbox; the order store reads it in the snapshot a
// Redis rebuild counts from. The waiting room alone writes and reads its
// per-minute roll-up for the report (the orders' half of the report is
// the order store's). The access package alone keeps a sale's invitation
// codes, their bindings and its allowlist. The load harness (loadtest) audits a run's
// orders in the database from outside, as an operator would, and is not in
// the production path.
var tableOwners = map[string]string{
	"orders":              "internal/adapter/postgres/orderstore loadtest",
	"stock_returns":       "internal/adapter/postgres/orderstore",
	"payments":            "internal/adapter/postgres/orderstore",
	"payment_signatures":  "internal/adapter/postgres/orderstore",
	"order_events":        "internal/adapter/postgres/orderstore events",
	"shopper_events":      "events",
	"stock_adds":          "internal/adapter/postgres/orderstore sales",
	"sale_report_minutes": "waitroom",
	"access_codes":        "access",
	"access_bindings":     "access",
	"access_allowlist":    "access",
}

// eventWriters may insert into the event outbox: one SQL builder.
const eventWriters = "internal/adapter/postgres/orderstore"

// sqlTable finds a table named by SQL: after FROM, INTO, UPDATE, JOIN or
// TABLE.
var sqlTable = regexp.MustCompile(`(?i)\b(FROM|INTO|UPDATE|JOIN|TABLE)\s+([a-z_]+)\b`)

// TestTableOwners checks that only the owners in tableOwners name their
// tables in SQL, and that only eventWriters insert order events.
func TestTableOwners(t *testing.T) {
	forCode(t, func(file, pkg, src string) {
		for _, m := range sqlTable.FindAllStringSubmatch(src, -1) {
			verb, table := strings.ToUpper(m[1]), strings.ToLower(m[2])
			owners, ok := tableOwners[table]
			if !ok {
				continue
			}
			if !words(owners)[pkg] {
				t.Errorf("%s names the table %s in SQL (%s %s); only %s may (layout_test.go, tableOwners)", file, table, m[1], m[2], owners)
			}
			if table == "order_events" && verb == "INTO" && !words(eventWriters)[pkg] {
				t.Errorf("%s inserts order events; only %s writes them (layout_test.go)", file, eventWriters)
			}
		}
	})
}

// forCode calls fn with each Go file of the checkout that is not a test,
// its package (a path inside the module, "flashsale" for the root) and
// its source.
func forCode(t *testing.T, fn func(file, pkg, src string)) {
	t.Helper()
	out, err := exec.Command("git", "ls-files", "--", "*.go").Output()
	if err != nil {
		t.Skipf("git ls-files: %v (not a git checkout?)", err)
	}
	for file := range strings.Lines(string(out)) {
		file = strings.TrimSpace(file)
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		pkg := "flashsale"
		if d := path.Dir(file); d != "." {
			pkg = d
		}
		src, err := os.ReadFile(file)
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted, not yet committed
		}
		if err != nil {
			t.Fatal(err)
		}
		fn(file, pkg, string(src))
	}
}

// stockKeys are lua's names of the stock's Redis keys; only stockKeyOwners
// (lua, which names them, and redisstock, which reads and writes them)
// may use them. A component that needs something of the stock asks
// redisstock, which answers through a method or, for a script that must
// read atomically with keys of its own, through RoomKeys and RoomLua.
var stockKeys = regexp.MustCompile(`\blua\.(StockKey|BuyersKey|PendingKey|ReservedKey|PlacedKey|PaidKey|HoldsKey|ShardKey)\(`)

const stockKeyOwners = "lua internal/adapter/redisstock"

// TestStockKeysOwner checks that only stockKeyOwners name the stock's keys
// outside tests.
func TestStockKeysOwner(t *testing.T) {
	owners := words(stockKeyOwners)
	forCode(t, func(file, pkg, src string) {
		if owners[pkg] {
			return
		}
		for _, m := range stockKeys.FindAllString(src, -1) {
			t.Errorf("%s names a stock key (%s); only %s may (layout_test.go, stockKeys)", file, m, stockKeyOwners)
		}
	})
}
