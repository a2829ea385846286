package main

import (
	"bytes"
	"flag"
	"os"
	"testing"
)

// serveHelpDoc is `kvshmd serve -h` as a page in docs/, where a reader of the repository finds every flag's default
// and environment variable without building the binary. The help is their one home; this page is generated from it.
const serveHelpDoc = "../../docs/kvshmd-serve.md"

var updateHelpDoc = flag.Bool("update-help-doc", false, "rewrite "+serveHelpDoc+" from kvshmd serve -h")

// renderServeHelpDoc renders serve's help (as -h prints it with no KVSHMD_* variable set) into the page.
func renderServeHelpDoc() []byte {
	var help bytes.Buffer
	_, err := parseServeFlags([]string{"-h"}, func(string) string { return "" },
		func(fs *flag.FlagSet) { serveUsage(fs, &help) }, &help)
	if err != flag.ErrHelp {
		panic(err)
	}
	var b bytes.Buffer
	b.WriteString("# kvshmd serve -h\n\n")
	b.WriteString("Generated from `kvshmd serve -h` (cmd/kvshmd/serveflags.go holds each flag's name, environment variable,\n")
	b.WriteString("default and help); do not edit: `go test ./cmd/kvshmd -run TestServeHelpDoc -update-help-doc` rewrites it.\n\n")
	b.WriteString("```text\n")
	b.Write(help.Bytes())
	b.WriteString("```\n")
	return b.Bytes()
}

// TestServeHelpDoc: docs/kvshmd-serve.md is what `kvshmd serve -h` prints, so a default changed in the flag
// registration cannot leave the page stale.
func TestServeHelpDoc(t *testing.T) {
	want := renderServeHelpDoc()
	if *updateHelpDoc {
		if err := os.WriteFile(serveHelpDoc, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(serveHelpDoc)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is not kvshmd serve -h's help: go test ./cmd/kvshmd -run TestServeHelpDoc -update-help-doc", serveHelpDoc)
	}
}
