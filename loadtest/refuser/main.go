// Command refuser is a bare net/http server that turns every request away
// with 503, a problem+json body and Retry-After, as shop turns away a buyer
// it has no room for:
//
//	refuser
//
// It listens on a free loopback port and prints its base URL as the first
// line of its output. make capacity (loadtest/runner) floods it and divides
// its process CPU by the requests answered: r0, the least a refusal costs on
// this machine, against which each row's goodput when flooded is judged.
// It is load-test tooling, not part of the service.
package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
)

const body = `{"type":"https://shop.example/problems/lock-busy","title":"Lock busy","status":503,` +
	`"detail":"the item is being sold to another buyer; try again"}` + "\n"

func refuse(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Retry-After", "1")
	w.WriteHeader(http.StatusServiceUnavailable)
	_, _ = w.Write([]byte(body))
}

func main() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintf(os.Stderr, "refuser: %v\n", err)
		os.Exit(1)
	}
	fmt.Printf("http://%s\n", ln.Addr())
	if err := http.Serve(ln, http.HandlerFunc(refuse)); err != nil {
		fmt.Fprintf(os.Stderr, "refuser: %v\n", err)
		os.Exit(1)
	}
}
