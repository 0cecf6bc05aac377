// Package push tells a shopper, by Web Push (RFC 8030, 8291, 8292), that
// their turn in a sale's queue has come, so that a closed tab or a
// sleeping phone does not cost them their place.
//
// A shopper's browser subscribes on the waiting page; the gateway checks
// the subscription (Parse) and keeps it per sale and user in Redis
// (Store, under lua.PushKey, which expires with the queue keys). The
// sale's leader, and only it, tells the Sender whom it admitted
// (Sender.Admitted, which never blocks: a full queue drops the batch and
// counts it); one goroutine, Sender.Run, reads their subscriptions and
// sends each an encrypted notification that opens the sale page. A push
// service that answers 404 or 410 has forgotten the subscription, which
// is then dropped. So a notification goes out at most once per
// admission: never twice, and not at all when the queue was full or the
// leader changed between the admission and its notice.
//
// It imports the root and lua (the key) and the prom adapter; the Web
// Push library (github.com/SherClockHolmes/webpush-go) is imported here
// and nowhere else (layout_test.go, confined).
package push
