// Package compute is the compute plane as the harness sees it: a Client that
// creates, resumes and deletes sandboxes through a Provider (local process,
// Docker container, remote address, ...), the Session that owns one live
// sandbox for a run, the serializable State that finds it again, and the
// errors every layer below the harness speaks.
//
// The life of a session:
//
//	client := compute.NewClient(provider, compute.ClientOptions{Snapshots: store, Log: log})
//	sess, err := client.Create(ctx, compute.CreateOptions{Manifest: m})
//	err = sess.Start(ctx)                 // materialize the manifest, or restore the snapshot
//	res, err := sess.Exec(ctx, compute.ProcessSpec{Command: "make test"}, compute.ExecOptions{}, nil)
//	                                      // processes, files, patches, ports: Go types
//	st, err := sess.State()               // JSON-serializable, redacted, no tokens
//	err = sess.Close(ctx)                 // pre-stop hooks -> stop (snapshot) -> shutdown
//	sess, err = client.Resume(ctx, st)    // reattach, or replace and restore
//	err = client.Delete(ctx, sess)
//
// Errors are plain Go values: errors.Is on the sentinels re-exported here
// (ErrNotFound, ErrPathEscape, ...), and Retryable(err) to decide whether
// trying the same call again can help and is safe.
package compute
