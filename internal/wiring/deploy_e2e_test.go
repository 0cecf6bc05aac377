package wiring_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/harness/testenv"
	"github.com/flashsale/flashsale/internal/wiring"
)

// scrapeNames returns the names of every series the app's /metrics serves
// (histograms as their _bucket, _sum and _count series).
func scrapeNames(t *testing.T, s *stack) map[string]bool {
	t.Helper()
	r, err := http.Get(s.App.AdminURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil || r.StatusCode != 200 {
		t.Fatalf("/metrics: %d, %v", r.StatusCode, err)
	}
	names := map[string]bool{}
	for line := range strings.SplitSeq(string(b), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		if i := strings.IndexAny(line, "{ "); i > 0 {
			names[line[:i]] = true
		}
	}
	return names
}

// metricRef finds flashsale_* metric names in rule expressions and
// dashboard queries.
var metricRef = regexp.MustCompile(`\bflashsale_[a-z0-9_]+`)

// TestDeployMetricsExist: every flashsale_* metric that the Prometheus
// alert rules (deploy/prometheus/alerts.yml) and the Grafana dashboard
// (deploy/grafana/flashsale.json) query is served by a running app after
// a drop, so renaming a metric breaks this test instead of an alert.
func TestDeployMetricsExist(t *testing.T) {
	// A webhook receiver, so the webhook's series are served too.
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(hook.Close)
	s := startStack(t, func(c *wiring.Config) {
		c.WebhookURL, c.WebhookSecret = hook.URL, "deploy-test-webhook-secret-0123456789"
	})
	saleID, items := s.createSale(1, 5)
	// A drop: a purchase, a pay, a sold-out refusal, an unknown route.
	at := s.admit(100, saleID)
	r := s.purchase(100, items[0], at)
	s.Want(r, 202, "")
	order := r.Body["orderId"].(string)
	s.waitPayable(100, order)
	s.Want(s.Do("POST", "/api/flash-sales/orders/"+order+"/pay", s.Token(100, false), nil), 200, "")
	s.Want(s.purchase(101, items[0], s.admit(101, saleID)), 410, "SOLD_OUT")
	s.Want(s.Do("GET", "/nope", "", nil), 404, "NOT_FOUND")

	var names map[string]bool
	var missing []string
	want := deployMetrics(t)
	testenv.EventuallyF(t, func() string {
		var have []string
		for n := range names {
			if strings.HasPrefix(n, "flashsale_") {
				have = append(have, n)
			}
		}
		slices.Sort(have)
		return fmt.Sprintf("the app to serve the metrics deploy/ queries; missing: %v\nserved: %v", missing, have)
	}, 30*time.Second, func() bool {
		names, missing = scrapeNames(t, s), nil
		for _, m := range want {
			if !names[m] {
				missing = append(missing, m)
			}
		}
		return len(missing) == 0
	})
}

// deployMetrics lists the flashsale_* names used in deploy/: anywhere in
// the alert rules, and in the dashboard's queries (panel targets and
// variables; descriptions may name metrics a later version adds).
func deployMetrics(t *testing.T) []string {
	t.Helper()
	var out []string
	add := func(text string) {
		for _, m := range metricRef.FindAllString(text, -1) {
			if !slices.Contains(out, m) {
				out = append(out, m)
			}
		}
	}
	rules, err := os.ReadFile("../../deploy/prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	add(string(rules))
	for _, q := range dashboardQueries(t) {
		add(q)
	}
	if len(out) == 0 {
		t.Fatal("no flashsale_* metric found in deploy/")
	}
	slices.Sort(out)
	return out
}

// dashboardQueries parses the Grafana dashboard, checks the form Grafana
// imports (schema 39 or later, a Prometheus data-source variable that
// every query uses) and returns its queries.
func dashboardQueries(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../deploy/grafana/flashsale.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		SchemaVersion int `json:"schemaVersion"`
		Templating    struct {
			List []struct {
				Name, Type string
				Query      any `json:"query"`
			} `json:"list"`
		} `json:"templating"`
		Panels []dashPanel `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("flashsale.json: %v", err)
	}
	if d.SchemaVersion < 39 {
		t.Errorf("schemaVersion %d, want 39 or later", d.SchemaVersion)
	}
	var queries []string
	hasDS := false
	for _, v := range d.Templating.List {
		if v.Type == "datasource" && v.Name == "datasource" && v.Query == "prometheus" {
			hasDS = true
		}
		if q, ok := v.Query.(map[string]any); ok {
			if s, ok := q["query"].(string); ok {
				queries = append(queries, s)
			}
		}
	}
	if !hasDS {
		t.Error("no Prometheus data-source variable named datasource")
	}
	var walk func(ps []dashPanel)
	walk = func(ps []dashPanel) {
		for _, p := range ps {
			walk(p.Panels)
			for _, tg := range p.Targets {
				if tg.Expr == "" {
					t.Errorf("panel %q: a target without a query", p.Title)
				}
				if tg.Datasource.UID != "${datasource}" {
					t.Errorf("panel %q: target data source %q, want ${datasource}", p.Title, tg.Datasource.UID)
				}
				queries = append(queries, tg.Expr)
			}
		}
	}
	walk(d.Panels)
	if len(queries) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	return queries
}

type dashPanel struct {
	Title   string      `json:"title"`
	Panels  []dashPanel `json:"panels"`
	Targets []struct {
		Expr       string `json:"expr"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
	} `json:"targets"`
}

// metricLine returns the value of one series of the stack's /metrics.
func metricLine(t *testing.T, s *stack, series string) string {
	t.Helper()
	r, err := http.Get(s.App.AdminURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return v
		}
	}
	return ""
}
