package kubeserver

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// APIError is a failed API request: the HTTP status and the Status
// message the API server sent.
type APIError struct {
	Method, Path string
	Code         int
	Reason       string
	Message      string
}

func (e *APIError) Error() string {
	return fmt.Sprintf("kubeserver: %s %s: %d %s: %s", e.Method, e.Path, e.Code, e.Reason, e.Message)
}

// IsNotFound and IsConflict say what an API error was.
func IsNotFound(err error) bool {
	var e *APIError
	return errors.As(err, &e) && e.Code == http.StatusNotFound
}

// IsAlreadyExists reports a create that found the object there.
func IsAlreadyExists(err error) bool {
	var e *APIError
	return errors.As(err, &e) && e.Code == http.StatusConflict && e.Reason == "AlreadyExists"
}

// adminClient is an HTTP client that authenticates as the cluster admin.
func newAdminClient(caPEM []byte, admin keyPair) (*http.Client, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("kubeserver: bad CA certificate")
	}
	cert, err := tls.LoadX509KeyPair(admin.Cert, admin.Key)
	if err != nil {
		return nil, fmt.Errorf("kubeserver: admin certificate: %w", err)
	}
	return &http.Client{
		Timeout: 60 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig:     &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
			MaxIdleConnsPerHost: 8,
			IdleConnTimeout:     30 * time.Second,
		},
	}, nil
}

// Do sends one request to the API server as the cluster admin: body (when
// not nil) is sent as JSON, and a 2xx answer is decoded into out (when not
// nil). Any other answer is an *APIError. path is the URL path with its
// query, as in "/api/v1/namespaces/x/pods".
func (c *Cluster) Do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("kubeserver: %s %s: %w", method, path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.Server+path, rd)
	if err != nil {
		return fmt.Errorf("kubeserver: %s %s: %w", method, path, err)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.admin.Do(req)
	if err != nil {
		return fmt.Errorf("kubeserver: %s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("kubeserver: %s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var st struct{ Reason, Message string }
		_ = json.Unmarshal(data, &st)
		if st.Message == "" {
			st.Message = strings.TrimSpace(string(data))
		}
		return &APIError{Method: method, Path: path, Code: resp.StatusCode, Reason: st.Reason, Message: st.Message}
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("kubeserver: %s %s: decode: %w", method, path, err)
		}
	}
	return nil
}

// kubeconfig is what a kubeconfig file holds for one cluster and user.
type kubeconfigUser struct {
	CertFile, KeyFile string // client certificate, or
	Token             string // bearer token
}

// writeKubeconfig writes a kubeconfig with one cluster (server, CA
// embedded), one user and one context, current, with namespace ns.
func writeKubeconfig(path, server string, caPEM []byte, user kubeconfigUser, ns string) error {
	var u string
	switch {
	case user.Token != "":
		u = "    token: " + user.Token + "\n"
	default:
		u = "    client-certificate: " + user.CertFile + "\n    client-key: " + user.KeyFile + "\n"
	}
	nsLine := ""
	if ns != "" {
		nsLine = "    namespace: " + ns + "\n"
	}
	cfg := "apiVersion: v1\nkind: Config\nclusters:\n- name: bulkhead-test\n  cluster:\n" +
		"    server: " + server + "\n" +
		"    certificate-authority-data: " + base64.StdEncoding.EncodeToString(caPEM) + "\n" +
		"users:\n- name: bulkhead-test-user\n  user:\n" + u +
		"contexts:\n- name: bulkhead-test\n  context:\n    cluster: bulkhead-test\n    user: bulkhead-test-user\n" + nsLine +
		"current-context: bulkhead-test\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return fmt.Errorf("kubeserver: kubeconfig: %w", err)
	}
	return nil
}

// Namespace creates a namespace with a fresh name for t, waits until its
// "default" ServiceAccount exists (Pods are refused before that), and
// deletes it when t ends (without waiting for it to go).
func (c *Cluster) Namespace(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name, err := c.CreateNamespace(ctx, "bhk-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.Do(ctx, http.MethodDelete, "/api/v1/namespaces/"+name, nil, nil); err != nil && !IsNotFound(err) {
			t.Logf("kubeserver: delete namespace %s: %v", name, err)
		}
	})
	return name
}

// CreateNamespace creates a namespace named prefix + random characters and
// waits until its default ServiceAccount exists; it returns the name.
func (c *Cluster) CreateNamespace(ctx context.Context, prefix string) (string, error) {
	var ns struct {
		Metadata struct{ Name string } `json:"metadata"`
	}
	body := map[string]any{"apiVersion": "v1", "kind": "Namespace",
		"metadata": map[string]any{"generateName": prefix, "labels": map[string]string{"bulkhead.dev/test": "true"}}}
	if err := c.Do(ctx, http.MethodPost, "/api/v1/namespaces", body, &ns); err != nil {
		return "", err
	}
	err := poll(ctx, 50*time.Millisecond, func() (bool, error) {
		err := c.Do(ctx, http.MethodGet, "/api/v1/namespaces/"+ns.Metadata.Name+"/serviceaccounts/default", nil, nil)
		if IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		return "", fmt.Errorf("kubeserver: namespace %s: waiting for its default ServiceAccount: %w", ns.Metadata.Name, err)
	}
	return ns.Metadata.Name, nil
}

// ServiceAccountKubeconfig creates the ServiceAccount saName in namespace
// (if missing), mints a token for it through the TokenRequest API (valid
// for a day) and writes a kubeconfig that authenticates with it, with
// namespace as its default; it returns the kubeconfig's path. The account
// can do only what RBAC grants it: bind a Role to it first or after.
func (c *Cluster) ServiceAccountKubeconfig(t testing.TB, namespace, saName string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	token, err := c.ServiceAccountToken(ctx, namespace, saName)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig-"+namespace+"-"+saName)
	if err := writeKubeconfig(path, c.Server, c.pki.CAPEM, kubeconfigUser{Token: token}, namespace); err != nil {
		t.Fatal(err)
	}
	return path
}

// ServiceAccountToken creates the ServiceAccount if missing and returns a
// fresh token for it (valid for a day).
func (c *Cluster) ServiceAccountToken(ctx context.Context, namespace, saName string) (string, error) {
	sa := map[string]any{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]any{"name": saName}}
	if err := c.Do(ctx, http.MethodPost, "/api/v1/namespaces/"+namespace+"/serviceaccounts", sa, nil); err != nil && !IsAlreadyExists(err) {
		return "", err
	}
	req := map[string]any{"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
		"spec": map[string]any{"expirationSeconds": 86400}}
	var tr struct {
		Status struct{ Token string } `json:"status"`
	}
	if err := c.Do(ctx, http.MethodPost, "/api/v1/namespaces/"+namespace+"/serviceaccounts/"+saName+"/token", req, &tr); err != nil {
		return "", err
	}
	if tr.Status.Token == "" {
		return "", fmt.Errorf("kubeserver: TokenRequest for %s/%s returned no token", namespace, saName)
	}
	return tr.Status.Token, nil
}

// poll calls f every interval until it returns true or an error, or ctx
// ends.
func poll(ctx context.Context, interval time.Duration, f func() (bool, error)) error {
	var last error
	for {
		ok, err := f()
		if ok && err == nil {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("%w (last error: %v)", ctx.Err(), last)
			}
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

// HTTPClient is an HTTP client that authenticates to the API server as
// the cluster admin (client certificate) and trusts its CA.
func (c *Cluster) HTTPClient() *http.Client { return c.admin }

// HTTPClientNoAuth is an HTTP client that trusts the API server's CA and
// sends no client certificate (for requests with a bearer token).
func (c *Cluster) HTTPClientNoAuth() *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(c.pki.CAPEM)
	return &http.Client{Timeout: 60 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
}

// TLSConfig is the admin's TLS configuration (CA and client certificate),
// for a client that dials the API server itself.
func (c *Cluster) TLSConfig() *tls.Config {
	return c.admin.Transport.(*http.Transport).TLSClientConfig.Clone()
}

// PauseBinary is the path of the pause program (static; `pause serve
// ADDR` serves HTTP), for tests that build an image of their own.
func (c *Cluster) PauseBinary() string { return c.bins.Pause }

// CgroupRoot is the cgroup the node's pods live under (the kubelet's
// cgroupRoot), as a path inside each cgroup hierarchy.
func (c *Cluster) CgroupRoot() string { return c.cgroupRoot() }
