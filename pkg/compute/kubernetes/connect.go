package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	//lint:ignore SA1019 client-go v0.37's portforward and its dialers still return apimachinery's httpstream types
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
)

// dialOptions are the gRPC dial options that reach the daemon of pod by
// the configured way, and the address to give agentclient.
func (p *Provider) dialOptions(pod *corev1.Pod) (string, []grpc.DialOption, error) {
	port := p.cfg.Port
	switch p.cfg.Connect {
	case ConnectPodIP:
		if pod.Status.PodIP == "" {
			return "", nil, fmt.Errorf("kubernetes: pod %s has no IP yet", pod.Name)
		}
		return "tcp://" + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(port)), nil, nil
	case ConnectExec:
		ns, name := pod.Namespace, pod.Name
		return "passthrough:///" + name, []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return p.execConn(ctx, ns, name, port)
		})}, nil
	default:
		ns, name := pod.Namespace, pod.Name
		return "passthrough:///" + name, []grpc.DialOption{grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return p.portForwardConn(ctx, ns, name, port)
		})}, nil
	}
}

// portForwardConn opens one connection to port in the pod through the API
// server's portforward subresource: WebSocket (SPDY tunnelled) first, SPDY
// when the server does not upgrade to it.
func (p *Provider) portForwardConn(ctx context.Context, ns, pod string, port int) (net.Conn, error) {
	if p.rest == nil {
		return nil, errors.New("kubernetes: port-forward needs a REST config (New or NewFromKubeconfig)")
	}
	u := p.client.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("portforward").URL()
	transport, upgrader, err := spdy.RoundTripperFor(p.rest)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: port-forward to %s: %w", pod, err)
	}
	spdyDialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
	wsDialer, err := portforward.NewSPDYOverWebsocketDialer(u, p.rest)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: port-forward to %s: %w", pod, err)
	}
	dialer := portforward.NewFallbackDialer(wsDialer, spdyDialer, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})

	type result struct {
		conn httpstream.Connection
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		c, _, err := dialer.Dial(portforward.PortForwardProtocolV1Name)
		ch <- result{c, err}
	}()
	var conn httpstream.Connection
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, p.apiErr("create", "pods/portforward", pod, r.err)
		}
		conn = r.conn
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.conn != nil {
				_ = r.conn.Close()
			}
		}()
		return nil, ctx.Err()
	}

	h := http.Header{}
	h.Set(corev1.StreamType, corev1.StreamTypeError)
	h.Set(corev1.PortHeader, strconv.Itoa(port))
	h.Set(corev1.PortForwardRequestIDHeader, "0")
	errStream, err := conn.CreateStream(h)
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("kubernetes: port-forward to %s: error stream: %w", pod, err)
	}
	_ = errStream.Close() // nothing is written to it
	h.Set(corev1.StreamType, corev1.StreamTypeData)
	data, err := conn.CreateStream(h)
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("kubernetes: port-forward to %s: data stream: %w", pod, err)
	}
	sc := &streamConn{r: data, w: data, closers: []io.Closer{data, conn}, name: "port-forward:" + ns + "/" + pod}
	go func() {
		// The kubelet writes here when it cannot reach the port (the
		// daemon gone): end the connection so gRPC redials.
		msg, _ := io.ReadAll(io.LimitReader(errStream, 4096))
		if len(msg) > 0 {
			sc.fail(fmt.Errorf("kubernetes: port-forward to %s: %s", pod, msg))
		}
	}()
	go func() {
		<-conn.CloseChan()
		_ = sc.Close()
	}()
	return sc, nil
}

// execConn opens one connection to port in the pod through the exec
// subresource: `nc 127.0.0.1 port` in the daemon's container relays its
// stdin and stdout to the daemon over the Pod's loopback. It works where
// the kubelet's port-forward cannot reach the sandbox's network stack
// (gVisor, Kata).
func (p *Provider) execConn(ctx context.Context, ns, pod string, port int) (net.Conn, error) {
	if p.rest == nil {
		return nil, errors.New("kubernetes: exec relay needs a REST config (New or NewFromKubeconfig)")
	}
	req := p.client.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: containerName,
			Command:   []string{"nc", "127.0.0.1", strconv.Itoa(port)},
			Stdin:     true, Stdout: true, Stderr: false,
		}, p.params)
	u := req.URL()
	spdyExec, err := remotecommand.NewSPDYExecutor(p.rest, http.MethodPost, u)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: exec relay to %s: %w", pod, err)
	}
	wsExec, err := remotecommand.NewWebSocketExecutor(p.rest, http.MethodGet, u.String())
	if err != nil {
		return nil, fmt.Errorf("kubernetes: exec relay to %s: %w", pod, err)
	}
	exec, err := remotecommand.NewFallbackExecutor(wsExec, spdyExec, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return nil, fmt.Errorf("kubernetes: exec relay to %s: %w", pod, err)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	sc := &streamConn{r: outR, w: inW, name: "exec:" + ns + "/" + pod}
	sc.closers = []io.Closer{inW, outR, closerFunc(func() error { cancel(); return nil })}
	go func() {
		err := exec.StreamWithContext(sctx, remotecommand.StreamOptions{Stdin: inR, Stdout: outW})
		if err == nil {
			err = io.EOF
		} else {
			err = p.apiErr("create", "pods/exec", pod, err)
		}
		_ = inR.CloseWithError(err)
		_ = outW.CloseWithError(err)
		sc.fail(err)
	}()
	return sc, nil
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// streamConn is a net.Conn over a tunnelled byte stream (deadlines are
// not supported: gRPC does not need them on an insecure transport).
type streamConn struct {
	r       io.Reader
	w       io.Writer
	closers []io.Closer
	name    string

	mu     sync.Mutex
	err    error
	closed bool
}

func (c *streamConn) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	if err != nil {
		if e := c.failure(); e != nil && errors.Is(err, io.EOF) {
			err = e
		}
	}
	return n, err
}

func (c *streamConn) Write(b []byte) (int, error) { return c.w.Write(b) }

func (c *streamConn) failure() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *streamConn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	_ = c.Close()
}

func (c *streamConn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	var errs []error
	for _, cl := range c.closers {
		errs = append(errs, cl.Close())
	}
	return errors.Join(errs...)
}

type tunnelAddr string

func (a tunnelAddr) Network() string { return "tunnel" }
func (a tunnelAddr) String() string  { return string(a) }

func (c *streamConn) LocalAddr() net.Addr              { return tunnelAddr("harness") }
func (c *streamConn) RemoteAddr() net.Addr             { return tunnelAddr(c.name) }
func (c *streamConn) SetDeadline(time.Time) error      { return nil }
func (c *streamConn) SetReadDeadline(time.Time) error  { return nil }
func (c *streamConn) SetWriteDeadline(time.Time) error { return nil }
