package wiring

import (
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// buildInfo is flashsale_build_info: always 1, labelled with the module
// version, the VCS revision and the Go version the binary was built from,
// so a dashboard can tell which build each process runs.
func buildInfo() prometheus.Collector {
	version, revision, goVersion := "unknown", "unknown", "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		goVersion = bi.GoVersion
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				revision = s.Value
			}
		}
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "flashsale_build_info",
		Help:        "Always 1; the labels say which build this process runs.",
		ConstLabels: prometheus.Labels{"version": version, "revision": revision, "goversion": goVersion},
	})
	g.Set(1)
	return g
}
