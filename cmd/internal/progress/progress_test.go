package progress

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestBarIsSilentOffTerminals(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	report, finish := Bar(f, "checkpoint")
	report(10, 100)
	report(100, 100)
	finish()
	if st, _ := f.Stat(); st.Size() != 0 {
		t.Fatalf("wrote %d bytes to a file", st.Size())
	}
}

func TestNewDrawsBytes(t *testing.T) {
	var b bytes.Buffer
	report, finish := New(&b, "restore")
	report(0, 3<<20)
	report(3<<20, 3<<20)
	finish()
	out := b.String()
	if !strings.Contains(out, "restore") || !strings.Contains(out, "100%") || !strings.Contains(out, "MB") || !strings.HasSuffix(out, "\n") {
		t.Fatalf("bar output %q", out)
	}
}
