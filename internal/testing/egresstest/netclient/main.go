// Command netclient is the network client the egress tests run inside a
// sandbox (curl may not exist there): "get URL" fetches through
// $HTTP(S)_PROXY as any HTTP client would (TLS not verified: the test
// servers' certificates are self-signed); "dial HOST:PORT" connects
// directly, with no proxy.
package main

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Println("usage: netclient get URL | dial HOST:PORT")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "get":
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true}
		resp, err := (&http.Client{Transport: tr, Timeout: 20 * time.Second}).Get(os.Args[2])
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		b, _ := io.ReadAll(resp.Body)
		fmt.Printf("status %d: %s\n", resp.StatusCode, b)
	case "dial":
		c, err := net.DialTimeout("tcp", os.Args[2], 5*time.Second)
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		c.Close()
		fmt.Println("connected")
	default:
		fmt.Println("unknown command", os.Args[1])
		os.Exit(2)
	}
}
