package loadtest

import (
	"fmt"
	"html"
	"html/template"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
)

// outcomeClass groups an outcome label for the charts.
func outcomeClass(step, outcome string) string {
	code, _, _ := strings.Cut(outcome, " ")
	switch {
	case strings.Contains(outcome, "SOLD_OUT") || code == "410":
		return "sold out"
	case code == "ADMITTED" || code == "payable" || code == "solved" ||
		code == "PREQUEUE" || code == "WAITING" || code == "PAID" || (len(code) == 3 && code[0] == '2'):
		return "ok"
	case len(code) == 3 && code[0] == '4':
		return "refused (4xx)"
	case len(code) == 3 && code[0] == '5':
		return "error (5xx)"
	default:
		return "error (transport)"
	}
}

var classColors = []struct{ name, color string }{
	{"requests", "#555555"},
	{"ok", "#2e7d32"},
	{"sold out", "#1565c0"},
	{"refused (4xx)", "#ef6c00"},
	{"error (5xx)", "#c62828"},
	{"error (transport)", "#6a1b9a"},
}

// timeseriesSVG draws per-second rates (from the 100 ms slots) of requests
// and of each outcome class.
func timeseriesSVG(ts []Slot) string {
	const w, h, pad = 900.0, 260.0, 40.0
	if len(ts) == 0 {
		return "<p>no data</p>"
	}
	series := map[string][]float64{}
	for _, c := range classColors {
		series[c.name] = make([]float64, len(ts))
	}
	peak := 1.0
	for i, s := range ts {
		series["requests"][i] = float64(s.Requests) * 10
		for k, v := range s.Outcomes {
			step, out, _ := strings.Cut(k, " ")
			series[outcomeClass(step, out)][i] += float64(v) * 10
		}
		for _, c := range classColors {
			peak = math.Max(peak, series[c.name][i])
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" role="img" aria-label="requests and outcomes per second over time">`, w, h+30, w, h+30)
	fmt.Fprintf(&b, `<rect x="%.0f" y="0" width="%.0f" height="%.0f" fill="#fafafa" stroke="#ccc"/>`, pad, w-pad, h-pad)
	x := func(i int) float64 { return pad + (w-pad)*float64(i)/math.Max(float64(len(ts)-1), 1) }
	y := func(v float64) float64 { return (h - pad) - (h-pad-5)*v/peak }
	for k := 0; k <= 4; k++ {
		v := peak * float64(k) / 4
		fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" font-size="10" text-anchor="end">%s</text>`, pad-3, y(v)+3, short(v))
	}
	secs := float64(len(ts)) / 10
	for k := 0; k <= 5; k++ {
		t := secs * float64(k) / 5
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" font-size="10" text-anchor="middle">%.1fs</text>`, pad+(w-pad)*float64(k)/5, h-pad+14, t)
	}
	for _, c := range classColors {
		var pts []string
		for i, v := range series[c.name] {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(i), y(v)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.3" points="%s"/>`, c.color, strings.Join(pts, " "))
	}
	lx := pad
	for _, c := range classColors {
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="10" height="10" fill="%s"/><text x="%.0f" y="%.0f" font-size="11">%s/s</text>`,
			lx, h-8, c.color, lx+14, h+1, html.EscapeString(c.name))
		lx += 140
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// histogramSVG draws one step's latency histogram on a log time axis.
func histogramSVG(name string, sr StepReport) string {
	const w, h, pad = 440.0, 180.0, 36.0
	if len(sr.Histogram) == 0 {
		return ""
	}
	lo := math.Log10(math.Max(sr.Histogram[0].LeMs/1.05, 0.01))
	hi := math.Log10(sr.Histogram[len(sr.Histogram)-1].LeMs)
	if hi-lo < 1 {
		hi = lo + 1
	}
	var peak int64 = 1
	for _, bk := range sr.Histogram {
		peak = max(peak, bk.Count)
	}
	x := func(msv float64) float64 { return pad + (w-pad-5)*(math.Log10(msv)-lo)/(hi-lo) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" role="img" aria-label="latency histogram %s">`, w, h, w, h, html.EscapeString(name))
	fmt.Fprintf(&b, `<text x="%.0f" y="12" font-size="12" font-weight="bold">%s (n=%d)</text>`, pad, html.EscapeString(name), sr.Count)
	base := h - 22
	for _, bk := range sr.Histogram {
		x1, x0 := x(bk.LeMs), x(bk.LeMs/1.05)
		bh := (base - 20) * float64(bk.Count) / float64(peak)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#1565c0"><title>≤ %.3f ms: %d</title></rect>`,
			x0, base-bh, math.Max(x1-x0, 1), bh, bk.LeMs, bk.Count)
	}
	fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#999"/>`, pad, base, w-5, base)
	for e := math.Ceil(lo); e <= hi; e++ {
		v := math.Pow(10, e)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" font-size="10" text-anchor="middle">%s</text>`, x(v), base+13, msLabel(v))
	}
	for _, p := range []struct {
		n string
		v float64
	}{{"p50", sr.Latency.P50Ms}, {"p99", sr.Latency.P99Ms}} {
		if p.v > 0 {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="18" x2="%.1f" y2="%.0f" stroke="#c62828" stroke-dasharray="3,2"/><text x="%.1f" y="28" font-size="10" fill="#c62828">%s</text>`,
				x(p.v), x(p.v), base, x(p.v)+2, p.n)
		}
	}
	b.WriteString(`</svg>`)
	return b.String()
}

func msLabel(v float64) string {
	switch {
	case v >= 1000:
		return strconv.FormatFloat(v/1000, 'g', 3, 64) + "s"
	case v >= 1:
		return strconv.FormatFloat(v, 'g', 3, 64) + "ms"
	default:
		return strconv.FormatFloat(v*1000, 'g', 3, 64) + "µs"
	}
}

func short(v float64) string {
	switch {
	case v >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', 1, 64) + "M"
	case v >= 1e3:
		return strconv.FormatFloat(v/1e3, 'f', 1, 64) + "k"
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

type htmlStep struct {
	Name     string
	R        StepReport
	Outcomes []kv
}

type kv struct {
	K string
	V int64
}

var reportTmpl = template.Must(template.New("r").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>flashsale load report {{.R.Scenario}} sale {{.R.SaleID}}</title>
<style>body{font:14px system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:8px 0 20px}
td,th{border:1px solid #ddd;padding:4px 8px;text-align:right;vertical-align:top}th{background:#f2f2f2}td.l,th.l{text-align:left}
.ok{color:#2e7d32;font-weight:bold}.bad{color:#c62828;font-weight:bold}.skip{color:#888}.charts svg{margin:4px 12px 12px 0}</style></head>
<body><h1>flashsale load report</h1>
<table><tr><th class="l">scenario</th><td class="l">{{.R.Scenario}}</td><th class="l">sale</th><td>{{.R.SaleID}}</td><th class="l">transport</th><td class="l">{{.R.Transport}}</td></tr>
<tr><th class="l">shoppers</th><td>{{.R.Shoppers}}</td><th class="l">quantity</th><td>{{.R.Quantity}}</td><th class="l">items</th><td>{{.R.Items}}</td></tr>
<tr><th class="l">processes</th><td>{{.R.Processes}}</td><th class="l">source addresses</th><td>{{.R.SourceAddrs}}</td><th class="l">elapsed</th><td>{{.R.ElapsedMs}} ms</td></tr>
<tr><th class="l">started</th><td class="l">{{.R.StartedAt.UTC.Format "2006-01-02 15:04:05.000"}}</td><th class="l">opens</th><td class="l">{{.R.OpensAt.UTC.Format "15:04:05.000"}}</td><th class="l">stopped</th><td class="l">{{.R.Stopped}}</td></tr>
<tr><th class="l">opening → sell-out</th><td>{{if ge .R.SellOutMs 0}}{{.R.SellOutMs}} ms{{else}}—{{end}}</td><th class="l">last unit given (server)</th><td>{{with .R.AllocationMs}}{{.}} ms{{else}}—{{end}}</td><th class="l">last reservation</th><td>{{if ge .R.LastReservationMs 0}}{{.R.LastReservationMs}} ms{{else}}—{{end}}</td><th class="l">admissions/s</th><td>{{printf "%.1f" .R.AdmissionsPerSec}}</td></tr></table>
<h2>Invariants</h2><table><tr><th class="l">check</th><th class="l">result</th><th class="l">detail</th></tr>
{{range .R.Invariants}}<tr><td class="l">{{.Name}}</td><td class="l">{{if .Skipped}}<span class="skip">skipped</span>{{else if .OK}}<span class="ok">ok</span>{{else}}<span class="bad">BROKEN</span>{{end}}</td><td class="l">{{.Detail}}</td></tr>
{{end}}</table>
<h2>Orders</h2><table><tr><th>202s</th><th>users with an order</th><th>paid by run</th><th>quantity</th><th>remaining</th><th>sold</th><th>paid</th><th>expired</th><th>cancelled</th><th>rejected</th></tr>
<tr><td>{{.R.Orders.Reserved}}</td><td>{{.R.Orders.Users}}</td><td>{{.R.Orders.PaidRun}}</td><td>{{.R.Orders.Quantity}}</td><td>{{.R.Orders.Remaining}}</td><td>{{.R.Orders.Sold}}</td><td>{{.R.Orders.Paid}}</td><td>{{.R.Orders.Expired}}</td><td>{{.R.Orders.Cancelled}}</td><td>{{.R.Orders.Rejected}}</td></tr></table>
{{with .R.Summary}}<h2>Promises under faults</h2><table><tr><th>oversold</th><th>acknowledged</th><th>lost</th><th>rejected</th><th>cancelled (not by the shopper)</th><th>unverified</th><th>in flight</th><th>stranded units</th><th>5xx</th><th>network errors</th><th>reconnects</th><th>gateway moves</th><th>places lost</th></tr>
<tr><td>{{.Oversold}}</td><td>{{.Acknowledged}}</td><td>{{.AcknowledgedLost}}</td><td>{{.AcknowledgedRejected}}</td><td>{{.AcknowledgedCancelled}}</td><td>{{.AcknowledgedUnverified}}</td><td>{{.AcknowledgedInFlight}}</td><td>{{.StrandedUnits}}</td><td>{{.HTTP5xx.Total}}</td><td>{{.NetworkErrors.Total}}</td><td>{{.Reconnects}}</td><td>{{.GatewayMoves}}</td><td>{{.PlacesLost}}</td></tr></table>
{{if .HTTP5xx.ByRoute}}<p>5xx: {{range $k, $v := .HTTP5xx.ByRoute}}{{$k}} × {{$v}}; {{end}}</p>{{end}}
{{if .NetworkErrors.ByRoute}}<p>Network errors: {{range $k, $v := .NetworkErrors.ByRoute}}{{$k}} × {{$v}}; {{end}}</p>{{end}}{{end}}
{{with .R.Redis}}<h2>Redis commands around the hostile-only phase</h2><table>
<tr><th>baseline window</th><th>baseline commands</th><th>hostile phase</th><th>before</th><th>after</th><th>hostile commands</th><th>hostile requests</th><th>excess commands / hostile request</th></tr>
<tr><td>{{.BaselineMs}} ms</td><td>{{.BaselineCommands}}</td><td>{{.HostileMs}} ms</td><td>{{.Before}}</td><td>{{.After}}</td><td>{{.HostileCommands}}</td><td>{{.HostileRequests}}</td><td>{{printf "%.4f" .ExcessPerRequest}}</td></tr></table>{{if .Error}}<p class="bad">{{.Error}}</p>{{end}}{{end}}
{{with .R.CPU}}<h2>CPU-seconds by role</h2><pre>{{.Text}}</pre>{{end}}
<h2>Requests and outcomes over time</h2><div class="charts">{{.TS}}</div>
<h2>Steps</h2><table><tr><th class="l">step</th><th>count</th><th>p50 ms</th><th>p90 ms</th><th>p99 ms</th><th>max ms</th><th class="l">outcomes</th></tr>
{{range .Steps}}<tr><td class="l">{{.Name}}</td><td>{{.R.Count}}</td><td>{{printf "%.2f" .R.Latency.P50Ms}}</td><td>{{printf "%.2f" .R.Latency.P90Ms}}</td><td>{{printf "%.2f" .R.Latency.P99Ms}}</td><td>{{printf "%.2f" .R.Latency.MaxMs}}</td>
<td class="l">{{range .Outcomes}}{{.K}}: {{.V}}<br>{{end}}</td></tr>
{{end}}</table>
<h2>Latency histograms</h2><div class="charts">{{range .Hists}}{{.}}{{end}}</div>
{{with .R.Queue}}<p>Queue: joined {{.Joined}}, admitted {{.Admitted}}, waiting {{.Waiting}}.</p>{{end}}
{{if .R.Notes}}<h2>Notes</h2><ul>{{range .R.Notes}}<li>{{.}}</li>{{end}}</ul>{{end}}
{{if .R.Errors}}<h2>Error samples</h2><ul>{{range .R.Errors}}<li><code>{{.}}</code></li>{{end}}</ul>{{end}}
</body></html>
`))

// WriteHTML writes a self-contained HTML page (inline CSS and SVG, no
// external assets) with the summary, invariants, charts of requests and
// outcomes over time and latency histograms.
func (r *Report) WriteHTML(w io.Writer) error {
	var steps []htmlStep
	names := make([]string, 0, len(r.Steps))
	for n := range r.Steps {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return stepOrder(names[i]) < stepOrder(names[j]) })
	var hists []template.HTML
	for _, n := range names {
		sr := r.Steps[n]
		hs := htmlStep{Name: n, R: sr}
		for k, v := range sr.Outcomes {
			hs.Outcomes = append(hs.Outcomes, kv{k, v})
		}
		sort.Slice(hs.Outcomes, func(i, j int) bool { return hs.Outcomes[i].V > hs.Outcomes[j].V })
		steps = append(steps, hs)
		hists = append(hists, template.HTML(histogramSVG(n, sr))) // built from numbers and escaped names
	}
	return reportTmpl.Execute(w, map[string]any{
		"R": r, "Steps": steps, "Hists": hists,
		"TS": template.HTML(timeseriesSVG(r.Timeseries)),
	})
}

func stepOrder(n string) string {
	order := []string{StepPreconnect, StepJoin, StepPow, StepPoll, StepReconnect, StepRejoin, StepAdmittedWait, StepPurchase, StepSaleOrder,
		StepOrderGet, StepPayable, StepPay, StepEarly, StepFlood}
	for i, s := range order {
		if n == s {
			return fmt.Sprintf("%02d", i)
		}
	}
	return "99" + n
}
