// Command dying is a replica that dies while its crash points are being
// cleared: it answers the probes, and on DELETE /faults/crash it stops
// listening and drops the call at once, and exits at a crash point's status a moment later, as
// a replica does when a crash point fires while the fault kit talks to it.
package main

import (
	"net"
	"net/http"
	"os"
	"time"
)

func main() {
	ln, err := net.Listen("tcp", os.Getenv("HTTP_ADDR"))
	if err != nil {
		os.Exit(1)
	}
	mux := http.NewServeMux()
	ok := func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }
	mux.HandleFunc("GET /healthz", ok)
	mux.HandleFunc("GET /readyz", ok)
	mux.HandleFunc("DELETE /faults/crash", func(w http.ResponseWriter, _ *http.Request) {
		ln.Close()
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			conn.Close() // no answer: the call fails at once
		}
		time.Sleep(300 * time.Millisecond)
		os.Exit(137)
	})
	_ = http.Serve(ln, mux)
	select {} // the listener closed: wait for the exit above
}
