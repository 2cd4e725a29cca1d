// Package replay is a scripted OpenAI Responses API server: the offline
// model behind `harness run --replay` (a recorded session, LoadRecording) and
// the model of the tests, which script its turns and faults.
//
// It is production code, linked into the harness for --replay, hence not a
// ...test package; nothing in it is test-only.
//
// A [Server] is a real HTTP server on loopback that answers POST /v1/responses
// (and POST /responses, for clients whose base URL already ends in /v1) in the
// Responses wire format: a JSON response object, or, when the request asks for
// stream: true, the server-sent event sequence the OpenAI API emits
// (response.created, response.in_progress, response.output_item.added, the
// per-item delta and done events, response.completed), every event numbered
// with sequence_number.
//
// What the server answers is scripted: each request takes the next [Turn] from
// the queue (or asks a [Responder] built from the request), and every request
// body is recorded, decoded, so a test can assert what the model was sent.
// Faults are scripted per turn: an HTTP error status with Retry-After headers,
// a stream whose connection is cut after a number of events, or a stream that
// stalls until the client goes away.
//
// The server holds no global state; any number may run side by side.
package replay
