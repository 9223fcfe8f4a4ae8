package cuda

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// TestEnvNamesAreTheRankContract checks that the variables package cuda reads
// are the ones the rank contract names. Package cuda sits below rank and cannot
// import it, so the test reads rank's source.
func TestEnvNamesAreTheRankContract(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), repoFile(t, "rank/env.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	consts := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok {
			return true
		}
		for i, name := range vs.Names {
			if i < len(vs.Values) {
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					consts[name.Name], _ = strconv.Unquote(lit.Value)
				}
			}
		}
		return true
	})
	for name, ours := range map[string]string{"EnvCUDALib": envCUDALib, "EnvNCCLLib": envNCCLLib} {
		if consts[name] != ours {
			t.Errorf("rank.%s = %q, package cuda reads %q", name, consts[name], ours)
		}
	}
}

// repoFile finds a file of the repository from the working directory (the
// package's directory under go test, or anywhere inside the repository when a
// compiled test binary runs elsewhere).
func repoFile(t *testing.T, rel string) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, rel)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.mod above the working directory: run the test inside the repository")
		}
		dir = parent
	}
}
