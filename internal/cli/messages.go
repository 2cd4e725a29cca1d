package cli

import "strings"

// The words of an error line the CLI prints (Execute): the libraries
// below it name their own configuration, for programs that embed them;
// a user of the command line needs the flag or variable that sets it.

// libraryWords pairs what the libraries' messages name with the command
// line's terms: a configuration field becomes the flag or variable that
// sets it, or goes where the command line sets it itself (or offers no way
// to). Each left side is the exact text of a library's message (a test
// checks that the libraries still say it).
var libraryWords = []string{
	// pkg/compute/materializer
	"(materializer.Options.BaseDir)", "(--base-dir, or --manifest: host sources are read below its directory)",
	"(materializer.Options.HostGrants)", "(--host-grant DIR)",
	// pkg/compute/mount and its backends
	"(the limit, mount.Config.MaxBytes)", "(the limit, --mount-max-bytes)",
	"(the limit, mount.Config.MaxObjects)", "(the limit)",
	" (mount.Config.MaxObjects)", "",
	"(s3mount.Config.FileSystems)", "(--s3-file-system FS_ID=s3://BUCKET[/PREFIX])",
	"no default mount credentials (s3mount.Config.DefaultCredentials)", "no default mount credentials (name them in the entry's credentials)",
	"no default GCS token source (gcsmount.Config.Tokens)", "no default GCS credentials (name them in the entry's credentials)",
	"no default Azure credential (azuremount.Config.Credential)", "no default Azure credential (name one in the entry's credentials)",
	// pkg/compute/local
	"is neither Config.Runsc nor on PATH", "is not on PATH",
	" (Config.NoSeccomp turns it off for debugging)", "",
	// pkg/harness/model
	"set Config.APIKey or OPENAI_API_KEY", "set OPENAI_API_KEY",
}

var cliWords = strings.NewReplacer(libraryWords...)

// userMessage is the one line Execute prints for err under the command
// path: the libraries' configuration fields in the command line's terms,
// and no word said twice at the front (the command's own name, which
// Execute prints before it, or a prefix a wrap repeated: "manifest:
// manifest: ...").
func userMessage(commandPath, msg string) string {
	msg = cliWords.Replace(oneLine(msg))
	words := strings.Fields(commandPath)
	for i := 1; i < len(words); i++ {
		if rest, ok := strings.CutPrefix(msg, strings.Join(words[i:], " ")+": "); ok {
			msg = rest
			break
		}
	}
	return dropRepeatedPrefixes(msg)
}

// dropRepeatedPrefixes removes a "word: " segment that repeats the one
// before it ("a: manifest: manifest: b" becomes "a: manifest: b"); the last
// segment, the message itself, is kept whatever it says.
func dropRepeatedPrefixes(msg string) string {
	parts := strings.Split(msg, ": ")
	out := parts[:1]
	for i := 1; i < len(parts); i++ {
		if i < len(parts)-1 && parts[i] == out[len(out)-1] {
			continue
		}
		out = append(out, parts[i])
	}
	return strings.Join(out, ": ")
}
