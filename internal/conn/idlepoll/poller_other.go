//go:build !linux

package idlepoll

import (
	"errors"
	"syscall"
)

// Poller is not available off Linux: New fails, and the caller keeps a
// goroutine per connection.
type Poller struct{ pollerState }

// New fails off Linux.
func New() (*Poller, error) { return nil, errors.ErrUnsupported }

// Close does nothing.
func (p *Poller) Close() {}

func (p *Poller) add(fd int, id uint64) error { return errors.ErrUnsupported }
func (p *Poller) del(fd int)                  {}

// Take fails off Linux.
func Take(rc syscall.RawConn, buf []byte) (int, error) { return 0, errors.ErrUnsupported }
