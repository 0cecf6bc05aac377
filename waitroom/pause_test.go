package waitroom

import (
	"context"
	"testing"
	"time"

	"github.com/flashsale/flashsale"
)

// A paused sale's cursor stands still while its credit grows, everyone
// not yet admitted sees PAUSED (over the WebSocket and the polling
// status) and an admitted shopper stays ADMITTED; after the resume the
// next in line is admitted.
func TestPausedSaleHoldsTheCursor(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 71, e.clock.Now().Add(-time.Second), 1000, 100))
	g := e.newGateway(Config{}, nil)
	first := dial(t, g.url(71))
	first.join(e.token(1))
	// The first tick may admit the shopper at once (the credit since the
	// opening) or find it not yet joined and spend the credit.
	if m := first.until("a place", 10*time.Second, func(m msg) bool {
		return m.Type == TypeStatus && (m.State == StateWaiting || m.State == StateAdmitted)
	}); m.State == StateWaiting {
		e.clock.Advance(time.Second)
	}
	first.untilAdmitted()

	paused := *sale
	paused.Paused, paused.Version = true, 2
	e.sales.put(&paused)
	next := dial(t, g.url(71))
	next.join(e.token(2))
	next.untilState(StatePaused)
	st, err := g.room.Join(context.Background(), flashsale.Principal{UserID: 3}, 71, testIP, nil, "")
	if err != nil || st.State != StatePaused {
		t.Fatalf("polling join while paused: %+v, %v", st, err)
	}
	for range 3 {
		e.clock.Advance(time.Second)
		g.waitTicks(t, 2)
	}
	if n := g.admitted(t, 71); n != 1 {
		t.Fatalf("cursor at %d while paused, want 1", n)
	}
	if st, err := g.room.Status(context.Background(), flashsale.Principal{UserID: 1}, 71); err != nil || st.State != StateAdmitted || st.AdmissionToken == "" {
		t.Fatalf("the admitted shopper while paused: %+v, %v", st, err)
	}

	resumed := paused
	resumed.Paused, resumed.Version = false, 3
	e.sales.put(&resumed)
	e.clock.Advance(time.Second)
	next.untilAdmitted()
}

// The operator's message reaches every connection of the sale on the next
// tick, after its first status for one that joins later; the polling
// status carries it; clearing it is sent as text "".
func TestOperatorMessage(t *testing.T) {
	e := newEnv(t)
	sale := e.addSale(newSale(t, 72, e.clock.Now().Add(time.Hour), 1000, 100))
	g := e.newGateway(Config{}, nil)
	a := dial(t, g.url(72))
	a.join(e.token(1))
	a.untilState(StatePrequeue)

	at := e.clock.Now()
	withMsg := *sale
	withMsg.Message, withMsg.MessageAt = "Doors open at 19:00", at
	e.sales.put(&withMsg)
	isMsg := func(m msg) bool {
		return m.Type == TypeMessage && m.Text == withMsg.Message && m.AtMs == at.UnixMilli()
	}
	a.until("the message", 10*time.Second, isMsg)

	late := dial(t, g.url(72))
	late.join(e.token(2))
	if m, err := late.read(10 * time.Second); err != nil || m.Type != TypeStatus {
		t.Fatalf("late joiner's first message %+v, %v; want a status", m, err)
	}
	late.until("the message", 10*time.Second, isMsg)
	st, err := g.room.Status(context.Background(), flashsale.Principal{UserID: 2}, 72)
	if err != nil || st.Message == nil || st.Message.Text != withMsg.Message {
		t.Fatalf("polling status %+v, %v; want the message", st, err)
	}

	cleared := withMsg
	cleared.Message, cleared.MessageAt = "", time.Time{}
	e.sales.put(&cleared)
	a.until("the clearing", 10*time.Second, func(m msg) bool { return m.Type == TypeMessage && m.Text == "" })
	if st, _ := g.room.Status(context.Background(), flashsale.Principal{UserID: 2}, 72); st.Message != nil {
		t.Fatalf("polling status after the clearing carries %+v", st.Message)
	}
}
