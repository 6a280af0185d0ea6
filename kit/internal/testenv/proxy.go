package testenv

import (
	"strings"
	"testing"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Proxy starts an in-process Toxiproxy between the code under test and
// upstream (host:port) and returns it; its Listen field is the address to dial.
// Network faults are toxics on it (a "timeout" toxic with timeout 0 is a
// blackhole); Stop cuts every connection and refuses new ones until Start.
func Proxy(t testing.TB, name, upstream string) *toxiproxy.Proxy {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

// AddToxic adds a toxic described in Toxiproxy's JSON, e.g.
// {"name":"blackhole","type":"timeout","stream":"downstream","attributes":{"timeout":0}}.
func AddToxic(t testing.TB, p *toxiproxy.Proxy, spec string) {
	t.Helper()
	if _, err := p.Toxics.AddToxicJson(strings.NewReader(spec)); err != nil {
		t.Fatal(err)
	}
}

// RemoveToxic removes a toxic by name.
func RemoveToxic(t testing.TB, p *toxiproxy.Proxy, name string) {
	t.Helper()
	if err := p.Toxics.RemoveToxic(t.Context(), name); err != nil {
		t.Fatal(err)
	}
}
