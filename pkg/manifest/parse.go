package manifest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Format is the syntax of a manifest document.
type Format int

// Formats. FormatAuto reads JSON when the first non-blank byte is '{' and
// YAML otherwise.
const (
	FormatAuto Format = iota
	FormatYAML
	FormatJSON
)

func (f Format) String() string {
	switch f {
	case FormatYAML:
		return "yaml"
	case FormatJSON:
		return "json"
	}
	return "auto"
}

// maxNesting bounds how deeply mappings and lists may nest (about half of it
// in nested dir entries), so that decoding never recurses without bound.
const maxNesting = 256

// nodeKind is the kind of a value in the syntax-neutral tree both YAML and
// JSON are read into before decoding.
type nodeKind int

const (
	kindNull nodeKind = iota
	kindBool
	kindNumber
	kindString
	kindMap
	kindList
)

func (k nodeKind) String() string {
	return [...]string{"null", "a boolean", "a number", "a string", "a mapping", "a list"}[k]
}

// node is one value of a parsed document. Mappings keep their keys in
// document order; duplicate keys are rejected while parsing.
type node struct {
	kind     nodeKind
	text     string // scalar text as written (strings: their value)
	keys     []string
	keyLines []int
	items    []*node // mapping values (parallel to keys) or list items
	line     int
	yaml     bool // a YAML scalar: numbers and booleans may stand in for strings
}

// parseDocument reads data into a node tree.
func parseDocument(data []byte, f Format) (*node, *FieldError) {
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf")) // a UTF-8 byte order mark
	if f == FormatAuto {
		f = detectFormat(data)
	}
	if f == FormatJSON {
		return parseJSON(data)
	}
	return parseYAML(data)
}

func detectFormat(data []byte) Format {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if len(trimmed) > 0 && trimmed[0] == '{' {
		return FormatJSON
	}
	return FormatYAML
}

func syntaxErr(line int, format string, args ...any) *FieldError {
	return &FieldError{Line: line, Msg: fmt.Sprintf(format, args...), Kind: ErrSyntax}
}

// ---- JSON ----

type jsonParser struct {
	dec      *json.Decoder
	newlines []int // offsets of '\n', for line numbers
	size     int
}

func parseJSON(data []byte) (*node, *FieldError) {
	p := &jsonParser{dec: json.NewDecoder(bytes.NewReader(data)), size: len(data)}
	p.dec.UseNumber()
	for i, c := range data {
		if c == '\n' {
			p.newlines = append(p.newlines, i)
		}
	}
	n, ferr := p.value(0)
	if ferr != nil {
		return nil, ferr
	}
	if _, err := p.dec.Token(); err != io.EOF {
		return nil, syntaxErr(p.line(), "unexpected data after the JSON document")
	}
	return n, nil
}

// line returns the line of the decoder's current position.
func (p *jsonParser) line() int {
	off := int(p.dec.InputOffset())
	return sort.SearchInts(p.newlines, off) + 1
}

func (p *jsonParser) fail(err error) *FieldError {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return syntaxErr(sort.SearchInts(p.newlines, int(se.Offset))+1, "invalid JSON: %s", se.Error())
	}
	if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
		// The line of the last byte: where the input stopped.
		return syntaxErr(sort.SearchInts(p.newlines, p.size-1)+1, "invalid JSON: unexpected end of input")
	}
	return syntaxErr(p.line(), "invalid JSON: %s", err.Error())
}

func (p *jsonParser) value(depth int) (*node, *FieldError) {
	if depth > maxNesting {
		return nil, syntaxErr(p.line(), "document nests deeper than %d levels", maxNesting)
	}
	tok, err := p.dec.Token()
	if err != nil {
		return nil, p.fail(err)
	}
	line := p.line()
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			n := &node{kind: kindMap, line: line}
			seen := map[string]bool{}
			for p.dec.More() {
				ktok, err := p.dec.Token()
				if err != nil {
					return nil, p.fail(err)
				}
				key, ok := ktok.(string)
				if !ok {
					return nil, syntaxErr(p.line(), "invalid JSON: object key is not a string")
				}
				kline := p.line()
				if seen[key] {
					return nil, syntaxErr(kline, "duplicate key %q", key)
				}
				seen[key] = true
				v, ferr := p.value(depth + 1)
				if ferr != nil {
					return nil, ferr
				}
				n.keys = append(n.keys, key)
				n.keyLines = append(n.keyLines, kline)
				n.items = append(n.items, v)
			}
			if _, err := p.dec.Token(); err != nil {
				return nil, p.fail(err)
			}
			return n, nil
		case '[':
			n := &node{kind: kindList, line: line}
			for p.dec.More() {
				v, ferr := p.value(depth + 1)
				if ferr != nil {
					return nil, ferr
				}
				n.items = append(n.items, v)
			}
			if _, err := p.dec.Token(); err != nil {
				return nil, p.fail(err)
			}
			return n, nil
		}
		return nil, syntaxErr(line, "invalid JSON: unexpected %q", t.String())
	case string:
		return &node{kind: kindString, text: t, line: line}, nil
	case json.Number:
		return &node{kind: kindNumber, text: t.String(), line: line}, nil
	case bool:
		return &node{kind: kindBool, text: fmt.Sprint(t), line: line}, nil
	case nil:
		return &node{kind: kindNull, line: line}, nil
	}
	return nil, syntaxErr(line, "invalid JSON")
}

// ---- YAML ----

type yamlConv struct {
	budget    int                 // nodes left to create; bounds alias expansion
	expanding map[*yaml.Node]bool // aliases being expanded, to catch cycles
}

func parseYAML(data []byte) (n *node, ferr *FieldError) {
	// The YAML parser is third-party code fed untrusted bytes; a panic in it
	// must become an error, never crash the harness.
	defer func() {
		if r := recover(); r != nil {
			n, ferr = nil, syntaxErr(0, "invalid YAML: the parser could not read this document")
		}
	}()
	lr := &lineReader{data: data}
	dec := yaml.NewDecoder(lr)
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if err == io.EOF {
			return &node{kind: kindNull, line: 1}, nil
		}
		return nil, yamlErr(data, err, lr.lines)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err != io.EOF {
		if err == nil {
			return nil, syntaxErr(extra.Line, "more than one YAML document; a manifest is a single document")
		}
		return nil, yamlErr(data, err, lr.lines)
	}
	c := &yamlConv{budget: 4*len(data) + 10000, expanding: map[*yaml.Node]bool{}}
	return c.node(&doc, 0)
}

// yamlErr turns the YAML parser's error into a syntax error at the line
// where the document goes wrong. The parser's own "line N" is the line of
// the construct the fault is in (the mapping that holds it, counted from 0
// for some errors), not of the fault: for a key indented wrongly on line 5
// it says "line 2". The fault's line is the first line from which no
// prefix of the document parses: the last line the parser read (lines
// gives it, counted by lineReader) or, when the parser had to read on to
// notice (an unclosed bracket or quote), the line where the construct it
// could not finish began.
func yamlErr(data []byte, err error, lines int) *FieldError {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line, ok := yamlFaultLine(data, lines)
	if !ok {
		return syntaxErr(0, "invalid YAML: %s", msg)
	}
	return syntaxErr(line, "invalid YAML: %s", withoutLine(msg))
}

// withoutLine drops the "line N: " yaml.v3 puts before a syntax error.
func withoutLine(msg string) string {
	rest, ok := strings.CutPrefix(msg, "line ")
	if !ok {
		return msg
	}
	digits := len(rest) - len(strings.TrimLeft(rest, "0123456789"))
	if after, ok := strings.CutPrefix(rest[digits:], ": "); ok && digits > 0 {
		return after
	}
	return msg
}

// yamlFaultBudget bounds the bytes yamlFaultLine parses again (prefixes of
// the document), so that a large document with a fault near its top costs
// a bounded time; past it, the parser's own message stands.
const yamlFaultBudget = 8 << 20

// yamlFaultLine returns the first line L (1-based, at most upTo) such that
// the document's first L-1 lines parse and its first L..upTo do not.
func yamlFaultLine(data []byte, upTo int) (int, bool) {
	if upTo < 1 {
		return 0, false
	}
	ends := lineEnds(data)
	if upTo > len(ends) {
		upTo = len(ends)
	}
	spent := 0
	for l := upTo; l >= 1; l-- {
		prefix := data[:0]
		if l >= 2 {
			prefix = data[:ends[l-2]]
		}
		if spent += len(prefix); spent > yamlFaultBudget {
			return 0, false
		}
		if yamlParses(prefix) {
			return l, true
		}
	}
	return 1, true // unreachable: no lines parse
}

// lineEnds returns the offset just past each line of data (its newline
// included).
func lineEnds(data []byte) []int {
	var ends []int
	for i, b := range data {
		if b == '\n' {
			ends = append(ends, i+1)
		}
	}
	if len(data) > 0 && data[len(data)-1] != '\n' {
		ends = append(ends, len(data))
	}
	return ends
}

// yamlParses reports whether every document in data parses.
func yamlParses(data []byte) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var n yaml.Node
		switch err := dec.Decode(&n); {
		case err == io.EOF:
			return true
		case err != nil:
			return false
		}
	}
}

// lineReader hands the YAML parser one line per Read and counts the lines
// it handed over: when the parser fails, lines is how far it had read.
type lineReader struct {
	data  []byte
	lines int
}

func (r *lineReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := bytes.IndexByte(r.data, '\n') + 1
	if n == 0 {
		n = len(r.data)
	}
	if n > len(p) {
		n = len(p) // the rest of this line comes with the next Read
	} else {
		r.lines++
	}
	copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

func (c *yamlConv) node(y *yaml.Node, depth int) (*node, *FieldError) {
	if depth > maxNesting {
		return nil, syntaxErr(y.Line, "document nests deeper than %d levels", maxNesting)
	}
	c.budget--
	if c.budget < 0 {
		return nil, syntaxErr(y.Line, "document expands to too many values (YAML aliases)")
	}
	switch y.Kind {
	case yaml.DocumentNode:
		if len(y.Content) == 0 {
			return &node{kind: kindNull, line: y.Line}, nil
		}
		return c.node(y.Content[0], depth)
	case yaml.AliasNode:
		if y.Alias == nil {
			return nil, syntaxErr(y.Line, "alias to an unknown anchor")
		}
		if c.expanding[y.Alias] {
			return nil, syntaxErr(y.Line, "alias refers to itself")
		}
		c.expanding[y.Alias] = true
		defer delete(c.expanding, y.Alias)
		return c.node(y.Alias, depth+1)
	case yaml.MappingNode:
		n := &node{kind: kindMap, line: y.Line}
		seen := map[string]bool{}
		for i := 0; i+1 < len(y.Content); i += 2 {
			k := y.Content[i]
			for k.Kind == yaml.AliasNode && k.Alias != nil {
				k = k.Alias
			}
			if k.Kind != yaml.ScalarNode {
				return nil, syntaxErr(k.Line, "mapping keys must be plain scalars")
			}
			if k.ShortTag() == "!!merge" {
				return nil, syntaxErr(k.Line, "merge keys (<<) are not supported")
			}
			if seen[k.Value] {
				return nil, syntaxErr(k.Line, "duplicate key %q", k.Value)
			}
			seen[k.Value] = true
			v, ferr := c.node(y.Content[i+1], depth+1)
			if ferr != nil {
				return nil, ferr
			}
			n.keys = append(n.keys, k.Value)
			n.keyLines = append(n.keyLines, k.Line)
			n.items = append(n.items, v)
		}
		return n, nil
	case yaml.SequenceNode:
		n := &node{kind: kindList, line: y.Line}
		for _, it := range y.Content {
			v, ferr := c.node(it, depth+1)
			if ferr != nil {
				return nil, ferr
			}
			n.items = append(n.items, v)
		}
		return n, nil
	case yaml.ScalarNode:
		n := &node{text: y.Value, line: y.Line, yaml: true}
		switch tag := y.ShortTag(); tag {
		case "!!null":
			n.kind = kindNull
		case "!!bool":
			n.kind = kindBool
		case "!!int", "!!float":
			n.kind = kindNumber
		case "!!str", "!!timestamp":
			n.kind = kindString
		case "!!binary":
			return nil, syntaxErr(y.Line, "!!binary values are not supported; use content_base64")
		default:
			return nil, syntaxErr(y.Line, "unsupported YAML tag %q", tag)
		}
		return n, nil
	}
	return nil, syntaxErr(y.Line, "unsupported YAML node")
}

// lineIndex maps the field paths of a parsed document to their lines, so
// that problems found after decoding (by Validate or the trust rules) can
// still point into the document.
type lineIndex map[string]int

func indexLines(n *node) lineIndex {
	idx := lineIndex{}
	idx.record(n, "", false)
	return idx
}

// record walks n; keyed says whether n's keys are map keys (entries,
// children, environment, credentials) rather than field names.
func (idx lineIndex) record(n *node, path string, keyed bool) {
	switch n.kind {
	case kindMap:
		for i, k := range n.keys {
			cp := fieldPath(path, k)
			if keyed {
				cp = keyPath(path, k)
			}
			idx[cp] = n.keyLines[i]
			childKeyed := !keyed && (k == "entries" || k == "children" || k == "environment" || k == "credentials")
			idx.record(n.items[i], cp, childKeyed)
		}
	case kindList:
		for i, it := range n.items {
			cp := indexPath(path, i)
			idx[cp] = it.line
			idx.record(it, cp, false)
		}
	}
}

// attach gives every problem without a line the line of its field, or of
// the nearest enclosing field the document has.
func (idx lineIndex) attach(p *problems) {
	for _, prob := range p.list {
		for path := prob.Path; prob.Line == 0 && path != ""; path = parentPath(path) {
			prob.Line = idx[path]
		}
	}
}

// parentPath strips the last segment of a field path: a field name, a
// quoted key or an index. A quoted key never contains `["` (its quote would
// be escaped), and field names contain neither '.' nor '['.
func parentPath(p string) string {
	if strings.HasSuffix(p, `"]`) {
		if i := strings.LastIndex(p, `["`); i >= 0 {
			return p[:i]
		}
	}
	if i := strings.LastIndexAny(p, ".["); i >= 0 {
		return p[:i]
	}
	return ""
}
