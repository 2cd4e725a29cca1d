// Package patch parses and plans V4A "apply_patch" edits, the patch dialect
// that OpenAI models write when they edit files.
//
// The package is pure: it never touches a filesystem, holds no global state
// and starts no goroutines. The sandbox daemon uses it in two steps:
//
//  1. Parse turns a whole "*** Begin Patch" ... "*** End Patch" text into a
//     *Patch. FromOperations and ParseOperationsJSON build the same *Patch
//     from the per-file operation form ({type, path, diff, move_to}) used by
//     the hosted Responses tool.
//  2. Plan reads the current files through a read-only Source and computes
//     the final bytes of every file the patch touches, entirely in memory.
//     Either every operation applies and Plan returns the complete list of
//     Changes, or it returns an *Error and nothing needs undoing: the caller
//     writes only after Plan has succeeded.
//
// Semantics follow the Codex applier with the options a daemon wants:
//
//   - markers may be padded with whitespace, a "<<EOF" heredoc wrapper is
//     unwrapped, and a blank line directly after "*** Update File:" (or
//     "*** Move to:") is skipped instead of becoming an empty context line;
//   - stacked "@@ anchor" lines are accepted and searched in order, each
//     strictly after the previous one;
//   - a hunk is located by four passes over the file (exact, ignoring
//     trailing whitespace, ignoring surrounding whitespace, then folding
//     Unicode dashes, quotes and spaces to ASCII); a looser pass is tried only
//     when no position anywhere after the cursor matches a stricter one;
//   - a hunk made only of "+" lines is inserted right after its last anchor,
//     or at the end of the file when it has none;
//   - a line the patch does not change keeps its bytes: its own line ending
//     (LF, CRLF or lone CR), or none if it is the last line and had none
//     (it gains the file's first ending only when lines are added after
//     it); lines the patch adds take the file's first ending (LF in a file
//     that has none), so replacing the last line ends the file with one;
//   - files that are not valid UTF-8 are refused, never rewritten.
//
// Paths are used exactly as written in the patch. Resolving them and keeping
// them inside the workspace is the Source's and the caller's job.
package patch
