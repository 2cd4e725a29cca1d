// Command portserver is the server the preview tests run inside a sandbox:
// it listens on a free port of 127.0.0.1, writes the port to the file
// "port" (in its working directory), answers GET / with a greeting and
// the path, echoes WebSocket messages at /ws, answers an upgrade to
// /hangup and hangs up at once, and appends every request
// it gets (method, path, Host, headers) as a JSON line to requests.log.
package main

import (
	"encoding/json"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"

	"github.com/coder/websocket"
)

func main() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	var mu sync.Mutex
	logf, err := os.OpenFile("requests.log", os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		log.Fatal(err)
	}
	record := func(r *http.Request) {
		line, _ := json.Marshal(map[string]any{"method": r.Method, "path": r.URL.RequestURI(), "host": r.Host, "header": r.Header})
		mu.Lock()
		defer mu.Unlock()
		_, _ = logf.Write(append(line, '\n'))
		_ = logf.Sync()
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
		if err != nil {
			return
		}
		defer c.CloseNow()
		c.SetReadLimit(1 << 20)
		ctx := r.Context()
		for {
			typ, data, err := c.Read(ctx)
			if err != nil {
				return
			}
			if err := c.Write(ctx, typ, append([]byte("echo: "), data...)); err != nil {
				return
			}
		}
	})
	// /hangup switches protocols, then closes its side at once.
	mux.HandleFunc("/hangup", func(w http.ResponseWriter, r *http.Request) {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: test\r\nConnection: Upgrade\r\n\r\n")
		_ = brw.Flush()
		_ = conn.Close()
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "app", Value: "1", Path: "/"})
		fmt.Fprintf(w, "hello from the sandbox: %s %s\n", r.Method, r.URL.RequestURI())
	})
	tmp := "port.tmp"
	if err := os.WriteFile(tmp, []byte(strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)), 0o644); err != nil {
		log.Fatal(err)
	}
	if err := os.Rename(tmp, "port"); err != nil {
		log.Fatal(err)
	}
	log.Fatal(http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		record(r)
		mux.ServeHTTP(w, r)
	})))
}
