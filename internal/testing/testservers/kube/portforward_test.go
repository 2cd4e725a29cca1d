package kubeserver_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	kubeserver "github.com/bulkhead-dev/bulkhead/internal/testing/testservers/kube"
)

// portForwardGet sends "GET / HTTP/1.0" to port of the pod through the API
// server's port-forward subresource (WebSocket, subprotocol
// v4.channel.k8s.io: per port a data channel 0 and an error channel 1,
// each opened by the port number, little endian) and returns the answer.
// A minimal WebSocket client, so that the package needs no client-go.
func portForwardGet(ctx context.Context, c *kubeserver.Cluster, ns, pod string, port int) (string, error) {
	conn, br, err := wsDial(ctx, c, fmt.Sprintf("/api/v1/namespaces/%s/pods/%s/portforward?ports=%d", ns, pod, port))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	// The server opens both channels with the port number first.
	var out strings.Builder
	portsSeen := 0
	sent := false
	for {
		op, payload, err := readFrame(br)
		if err != nil {
			if errors.Is(err, io.EOF) && out.Len() > 0 {
				return out.String(), nil
			}
			return out.String(), err
		}
		switch op {
		case 0x8: // close
			return out.String(), nil
		case 0x9: // ping
			if err := writeFrame(conn, 0xA, payload); err != nil {
				return "", err
			}
			continue
		case 0x2, 0x0:
		default:
			continue
		}
		if len(payload) == 0 {
			continue
		}
		ch, data := payload[0], payload[1:]
		if portsSeen < 2 && len(data) == 2 && binary.LittleEndian.Uint16(data) == uint16(port) {
			portsSeen++
			if portsSeen == 2 && !sent {
				sent = true
				if err := writeFrame(conn, 0x2, append([]byte{0}, "GET / HTTP/1.0\r\n\r\n"...)); err != nil {
					return "", err
				}
			}
			continue
		}
		switch ch {
		case 0:
			out.Write(data)
			// HTTP/1.0: the server closes after its answer, which the
			// kubelet may or may not pass on as a close; stop at the body.
			if s := out.String(); strings.Contains(s, "\r\n\r\n") && strings.HasSuffix(s, "\n") && strings.Count(s, "bulkhead-pause") > 0 {
				return headersFree(s), nil
			}
		case 1:
			return out.String(), fmt.Errorf("port-forward error channel: %s", data)
		}
	}
}

// wsDial opens a WebSocket (subprotocol v4.channel.k8s.io) to path on the
// API server as the cluster admin.
func wsDial(ctx context.Context, c *kubeserver.Cluster, path string) (net.Conn, *bufio.Reader, error) {
	u, err := url.Parse(c.Server)
	if err != nil {
		return nil, nil, err
	}
	d := tls.Dialer{Config: c.TLSConfig()}
	conn, err := d.DialContext(ctx, "tcp", u.Host)
	if err != nil {
		return nil, nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	key := make([]byte, 16)
	_, _ = rand.Read(key)
	req := "GET " + path + " HTTP/1.1\r\nHost: " + u.Host + "\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " + base64.StdEncoding.EncodeToString(key) + "\r\n" +
		"Sec-WebSocket-Protocol: v4.channel.k8s.io\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		conn.Close()
		return nil, nil, err
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		conn.Close()
		return nil, nil, fmt.Errorf("upgrade %s: %s: %s", path, resp.Status, b)
	}
	return conn, br, nil
}

// execRun runs argv in the pod's first container through the API
// server's exec subresource and returns what it wrote to stdout and
// stderr and the status the server sent on the error channel (3).
func execRun(ctx context.Context, c *kubeserver.Cluster, ns, pod string, argv ...string) (stdout, stderr, status string, err error) {
	q := url.Values{"command": argv, "stdout": {"true"}, "stderr": {"true"}}
	conn, br, err := wsDial(ctx, c, fmt.Sprintf("/api/v1/namespaces/%s/pods/%s/exec?%s", ns, pod, q.Encode()))
	if err != nil {
		return "", "", "", err
	}
	defer conn.Close()
	var out, errOut, st strings.Builder
	for {
		op, payload, err := readFrame(br)
		if err != nil || op == 0x8 {
			if errors.Is(err, io.EOF) || op == 0x8 {
				err = nil
			}
			return out.String(), errOut.String(), st.String(), err
		}
		if op != 0x2 && op != 0x0 || len(payload) == 0 {
			continue
		}
		switch payload[0] {
		case 1:
			out.Write(payload[1:])
		case 2:
			errOut.Write(payload[1:])
		case 3:
			st.Write(payload[1:])
		}
	}
}

// headersFree keeps the status line and the body of an HTTP answer.
func headersFree(s string) string {
	status, rest, _ := strings.Cut(s, "\r\n")
	_, body, _ := strings.Cut(rest, "\r\n\r\n")
	return status + "\n" + body
}

func readFrame(r *bufio.Reader) (byte, []byte, error) {
	var h [2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	op := h[0] & 0x0f
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return 0, nil, err
		}
		n = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return 0, nil, err
		}
		n = binary.BigEndian.Uint64(b[:])
	}
	if n > 16<<20 {
		return 0, nil, errors.New("websocket frame too large: " + strconv.FormatUint(n, 10))
	}
	var mask [4]byte
	masked := h[1]&0x80 != 0
	if masked {
		if _, err := io.ReadFull(r, mask[:]); err != nil {
			return 0, nil, err
		}
	}
	p := make([]byte, n)
	if _, err := io.ReadFull(r, p); err != nil {
		return 0, nil, err
	}
	if masked {
		for i := range p {
			p[i] ^= mask[i%4]
		}
	}
	return op, p, nil
}

// writeFrame writes one final, masked frame (clients must mask).
func writeFrame(w net.Conn, op byte, p []byte) error {
	hdr := []byte{0x80 | op}
	switch {
	case len(p) < 126:
		hdr = append(hdr, 0x80|byte(len(p)))
	case len(p) < 1<<16:
		hdr = append(hdr, 0x80|126, byte(len(p)>>8), byte(len(p)))
	default:
		hdr = append(hdr, 0x80|127)
		hdr = binary.BigEndian.AppendUint64(hdr, uint64(len(p)))
	}
	var mask [4]byte
	_, _ = rand.Read(mask[:])
	hdr = append(hdr, mask[:]...)
	m := make([]byte, len(p))
	for i := range p {
		m[i] = p[i] ^ mask[i%4]
	}
	_ = w.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := w.Write(append(hdr, m...))
	return err
}
