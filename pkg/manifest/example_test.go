package manifest_test

import (
	"fmt"

	"github.com/bulkhead-dev/bulkhead/pkg/manifest"
)

func Example() {
	doc := []byte(`
users: [analyst]
run_as: analyst
entries:
  repo:
    type: dir
    description: the project
    children:
      task.md: {type: file, content: "Fix the failing test.\n"}
  notes.txt: {type: file, permissions: rw-r-----}
`)
	m, err := manifest.LoadUntrusted(doc, manifest.FormatYAML, manifest.UntrustedOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	tree, _ := m.RenderTree(manifest.TreeOptions{})
	fmt.Print(tree)

	_, err = manifest.LoadUntrusted([]byte("entries:\n  src/app.py: {type: file, permisions: '0644'}\n"),
		manifest.FormatYAML, manifest.UntrustedOptions{})
	fmt.Println(err)
	// Output:
	// /workspace
	// ├── notes.txt    # /workspace/notes.txt
	// └── repo/        # /workspace/repo — the project
	//     └── task.md  # /workspace/repo/task.md
	// manifest: entries["src/app.py"].permisions: unknown field; did you mean "permissions"? (line 2)
}
