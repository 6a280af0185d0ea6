package producer

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"
)

// proxy forwards TCP connections to the broker and cuts them all once the
// clients have sent a given number of bytes: a connection loss at a precise
// point of the stream, which stopping the broker could not give.
type proxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu          sync.Mutex
	conns       []net.Conn
	sent        int64 // bytes from clients, over all connections
	cuts        []cut // ascending
	refuseUntil time.Time
	dials       int // connections accepted, refused ones too
}

type cut struct {
	after  int64         // total client bytes
	refuse time.Duration // then close new connections at once for this long
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(func() {
		ln.Close()
		p.closeAll()
		p.wg.Wait()
	})
	return p
}

// url points an AMQP URL at the proxy.
func (p *proxy) url(t *testing.T, amqpURL string) string {
	u, err := url.Parse(amqpURL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = p.ln.Addr().String()
	return u.String()
}

func (p *proxy) cutAfter(bytes int64, refuse time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cuts = append(p.cuts, cut{after: bytes, refuse: refuse})
}

func (p *proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.dials++
		refusing := time.Now().Before(p.refuseUntil)
		p.mu.Unlock()
		if refusing {
			client.Close()
			continue
		}
		broker, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, client, broker)
		p.mu.Unlock()
		p.wg.Add(2)
		go p.forward(broker, client)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(client, broker)
			client.Close()
		}()
	}
}

// forward copies client bytes to the broker, cutting when a threshold passes.
func (p *proxy) forward(broker, client net.Conn) {
	defer p.wg.Done()
	defer broker.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			if _, werr := broker.Write(buf[:n]); werr != nil {
				return
			}
			if p.count(n) {
				p.closeAll()
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// dialled is the number of connections the proxy has accepted.
func (p *proxy) dialled() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dials
}

// count adds n sent bytes and reports whether a cut is due.
func (p *proxy) count(n int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sent += int64(n)
	if len(p.cuts) == 0 || p.sent < p.cuts[0].after {
		return false
	}
	p.refuseUntil = time.Now().Add(p.cuts[0].refuse)
	p.cuts = p.cuts[1:]
	return true
}

func (p *proxy) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}
