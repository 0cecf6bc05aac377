// Package browsertest drives the shopper page and the operator console in
// headless Chromium (through chromedp) against a whole flashsale stack
// started in-process on real Redis, PostgreSQL and an embedded Kafka
// (internal/harness/testenv). It holds tests only; run them with
//
//	go test -race -count=1 ./browsertest/...
//
// Chromium is looked up at /usr/bin/chromium (or FLASHSALE_CHROMIUM); without
// it the tests skip, unless CI is set, where they fail. Screenshots of every
// step are written to browsertest/artifacts/ (git-ignored). With
// FLASHSALE_UPDATE_SCREENSHOTS=1, TestScreenshots also rewrites the committed
// screenshots in docs/screenshots/.
package browsertest
