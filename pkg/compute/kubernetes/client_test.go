package kubernetes

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// TestRESTClientsetOnTheWire: the clientset New builds (client-go's REST
// client and gentype over the provider's own core and networking scheme)
// sends each operation the provider uses as the API server expects it,
// decodes the answers, a watch stream and a Status error, and encodes the
// options of an exec request.
func TestRESTClientsetOnTheWire(t *testing.T) {
	type seen struct{ method, path, query, ctype, body string }
	var (
		mu   sync.Mutex
		reqs []seen
	)
	pod := func(name string) string {
		return `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"` + name + `","namespace":"ns","resourceVersion":"7"}}`
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		reqs = append(reqs, seen{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Content-Type"), string(body)})
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Query().Get("watch") == "true":
			fl := w.(http.Flusher)
			for _, ev := range []string{`{"type":"ADDED","object":` + pod("p1") + `}`, `{"type":"DELETED","object":` + pod("p1") + `}`} {
				_, _ = w.Write([]byte(ev + "\n"))
				fl.Flush()
			}
		case r.Method == http.MethodPost && r.URL.Path == "/api/v1/namespaces/ns/pods",
			r.Method == http.MethodPut && r.URL.Path == "/api/v1/namespaces/ns/pods/p1",
			r.Method == http.MethodPatch && r.URL.Path == "/api/v1/namespaces/ns/pods/p1":
			_, _ = w.Write([]byte(pod("p1")))
		case r.Method == http.MethodDelete && r.URL.Path == "/api/v1/namespaces/ns/secrets/s1":
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Success"}`))
		case r.Method == http.MethodPost && r.URL.Path == "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies":
			_, _ = w.Write([]byte(`{"kind":"NetworkPolicy","apiVersion":"networking.k8s.io/v1","metadata":{"name":"np1"}}`))
		case r.Method == http.MethodGet && r.URL.Path == "/api/v1/namespaces/ns/persistentvolumeclaims/gone":
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,` +
				`"details":{"name":"gone","kind":"persistentvolumeclaims"},"message":"persistentvolumeclaims \"gone\" not found"}`))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	cs, err := newClientset(&rest.Config{Host: srv.URL, UserAgent: "bulkhead-harness"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pods := cs.CoreV1().Pods("ns")

	created, err := pods.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p1"}, Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever}},
		metav1.CreateOptions{FieldManager: "bulkhead"})
	if err != nil || created.Name != "p1" || created.ResourceVersion != "7" {
		t.Fatalf("Create = %+v, %v", created, err)
	}
	if _, err := pods.Update(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("Update: %v", err)
	}
	if _, err := pods.Patch(ctx, "p1", types.MergePatchType, []byte(`{"metadata":{"labels":{"a":"b"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatalf("Patch: %v", err)
	}
	if err := cs.CoreV1().Secrets("ns").Delete(ctx, "s1", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := cs.CoreV1().PersistentVolumeClaims("ns").Get(ctx, "gone", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("Get of a missing claim = %v, want NotFound", err)
	}
	if np, err := cs.NetworkingV1().NetworkPolicies("ns").Create(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "np1"}},
		metav1.CreateOptions{}); err != nil || np.Name != "np1" {
		t.Fatalf("NetworkPolicy Create = %v, %v", np, err)
	}
	w, err := pods.Watch(ctx, metav1.ListOptions{LabelSelector: "a=b", ResourceVersion: "7"})
	if err != nil {
		t.Fatal(err)
	}
	var events []string
	for ev := range w.ResultChan() {
		p, ok := ev.Object.(*corev1.Pod)
		if !ok {
			t.Fatalf("watch event %s carries a %T", ev.Type, ev.Object)
		}
		events = append(events, string(ev.Type)+" "+p.Name)
		if ev.Type == watch.Deleted {
			break
		}
	}
	w.Stop()
	if strings.Join(events, ",") != "ADDED p1,DELETED p1" {
		t.Fatalf("watch events %v", events)
	}

	// The exec relay's URL: the options encoded as the API server reads them.
	p := &Provider{client: cs, params: newAPICodecs().params}
	u := p.client.CoreV1().RESTClient().Post().Resource("pods").Namespace("ns").Name("p1").SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: containerName, Command: []string{"nc", "127.0.0.1", "9"}, Stdin: true, Stdout: true}, p.params).URL()
	if u.Path != "/api/v1/namespaces/ns/pods/p1/exec" || u.Query().Get("container") != containerName ||
		strings.Join(u.Query()["command"], " ") != "nc 127.0.0.1 9" || u.Query().Get("stdin") != "true" || u.Query().Has("stderr") {
		t.Fatalf("exec URL %s", u)
	}

	mu.Lock()
	defer mu.Unlock()
	want := []struct{ method, path, query string }{
		{"POST", "/api/v1/namespaces/ns/pods", "fieldManager=bulkhead"},
		{"PUT", "/api/v1/namespaces/ns/pods/p1", ""},
		{"PATCH", "/api/v1/namespaces/ns/pods/p1", ""},
		{"DELETE", "/api/v1/namespaces/ns/secrets/s1", ""},
		{"GET", "/api/v1/namespaces/ns/persistentvolumeclaims/gone", ""},
		{"POST", "/apis/networking.k8s.io/v1/namespaces/ns/networkpolicies", ""},
		{"GET", "/api/v1/namespaces/ns/pods", "labelSelector=a%3Db&resourceVersion=7&watch=true"},
	}
	if len(reqs) != len(want) {
		t.Fatalf("requests %+v", reqs)
	}
	for i, w := range want {
		if r := reqs[i]; r.method != w.method || r.path != w.path || r.query != w.query {
			t.Errorf("request %d: %s %s?%s, want %s %s?%s", i, r.method, r.path, r.query, w.method, w.path, w.query)
		}
	}
	if reqs[2].ctype != string(types.MergePatchType) {
		t.Errorf("patch content type %q", reqs[2].ctype)
	}
	// Objects go as protobuf, as client-go's typed core clients send them.
	if reqs[0].ctype != "application/vnd.kubernetes.protobuf" {
		t.Errorf("create content type %q", reqs[0].ctype)
	}
	obj, err := runtime.Decode(newAPICodecs().codecs.UniversalDeserializer(), []byte(reqs[0].body))
	if sent, ok := obj.(*corev1.Pod); err != nil || !ok || sent.Name != "p1" || sent.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("created pod sent as %T %v (%v)", obj, obj, err)
	}
}
