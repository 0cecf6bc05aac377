package wiring_test

import (
	"io"
	"regexp"
	"testing"
)

// TestBuildInfoServed: every process serves flashsale_build_info on its
// admin port, 1 with the build's labels.
func TestBuildInfoServed(t *testing.T) {
	s := startStack(t)
	res, err := s.Client.Get(s.App.AdminURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^flashsale_build_info\{goversion="go[^"]+",revision="[^"]+",version="[^"]+"\} 1$`)
	if !re.Match(body) {
		t.Errorf("no flashsale_build_info line of value 1 with goversion, revision and version in /metrics:\n%s", grepLines(body, "flashsale_build_info"))
	}
}

// grepLines is the lines of b that contain s.
func grepLines(b []byte, s string) string {
	var out []byte
	for _, l := range regexp.MustCompile(`(?m)^.*`+regexp.QuoteMeta(s)+`.*$`).FindAll(b, -1) {
		out = append(append(out, l...), '\n')
	}
	return string(out)
}
