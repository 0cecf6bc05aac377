package kafka

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSecurityCheck(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		s    Security
		want string // in the error; "" for none
	}{
		{"zero", Security{}, ""},
		{"TLS with the system roots", Security{TLS: true}, ""},
		{"SCRAM", Security{SASLMechanism: MechanismScramSHA512, Username: "u", Password: "p"}, ""},
		{"unknown mechanism", Security{SASLMechanism: "GSSAPI", Username: "u", Password: "p"}, `"GSSAPI"`},
		{"lower-case mechanism", Security{SASLMechanism: "plain", Username: "u", Password: "p"}, `"plain"`},
		{"no password", Security{SASLMechanism: MechanismPlain, Username: "u"}, "password"},
		{"no username", Security{SASLMechanism: MechanismPlain, Password: "p"}, "username"},
		{"password without mechanism", Security{Password: "p"}, "without a SASL mechanism"},
		{"missing CA", Security{TLS: true, CAFile: filepath.Join(dir, "missing.pem")}, "missing.pem"},
		{"CA not PEM", Security{TLS: true, CAFile: notPEM}, "no PEM certificate"},
		{"cert without key", Security{TLS: true, CertFile: notPEM}, "set both or neither"},
		{"key without cert", Security{TLS: true, KeyFile: notPEM}, "set both or neither"},
		{"bad client pair", Security{TLS: true, CertFile: notPEM, KeyFile: notPEM}, "client certificate"},
		{"CA without TLS", Security{CAFile: notPEM}, "TLS is off"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.s.Check()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("Check: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("Check: %v; want an error naming %s", err, tt.want)
			}
		})
	}
}

func TestSecurityStringHidesPassword(t *testing.T) {
	s := Security{TLS: true, SASLMechanism: MechanismScramSHA256, Username: "svc", Password: "hunter2"}
	for _, got := range []string{s.String(), fmt.Sprintf("%v %+v", s, s)} {
		if strings.Contains(got, "hunter2") || !strings.Contains(got, "SCRAM-SHA-256") || !strings.Contains(got, "svc") {
			t.Errorf("String() = %q: want the mechanism and user, never the password", got)
		}
	}
}

// TestAPI keeps the package doc's rule: no franz-go type in the exported
// API except ClientOpts, the options the other franz-go users take.
func TestAPI(t *testing.T) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, e := range entries {
		if n := e.Name(); strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") {
			f, err := parser.ParseFile(fset, n, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
	}
	franz := func(n ast.Node) string {
		var b strings.Builder
		_ = printer.Fprint(&b, fset, n)
		for _, p := range []string{"kgo.", "kadm.", "kerr.", "kmsg.", "sasl.", "plain.", "scram."} {
			if strings.Contains(b.String(), p) {
				return b.String()
			}
		}
		return ""
	}
	for _, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if !d.Name.IsExported() || d.Name.Name == "ClientOpts" {
					continue
				}
				if d.Recv != nil && !ast.IsExported(recvName(d.Recv)) {
					continue
				}
				if s := franz(d.Type); s != "" {
					t.Errorf("%s carries a franz-go type: %s", d.Name.Name, s)
				}
			case *ast.GenDecl:
				for _, sp := range d.Specs {
					ts, ok := sp.(*ast.TypeSpec)
					if !ok || !ts.Name.IsExported() {
						continue
					}
					st, ok := ts.Type.(*ast.StructType)
					if !ok {
						if s := franz(ts.Type); s != "" {
							t.Errorf("type %s is a franz-go type: %s", ts.Name.Name, s)
						}
						continue
					}
					for _, fl := range st.Fields.List {
						for _, n := range fl.Names {
							if n.IsExported() {
								if s := franz(fl.Type); s != "" {
									t.Errorf("%s.%s carries a franz-go type: %s", ts.Name.Name, n.Name, s)
								}
							}
						}
					}
				}
			}
		}
	}
}

func recvName(r *ast.FieldList) string {
	t := r.List[0].Type
	if s, ok := t.(*ast.StarExpr); ok {
		t = s.X
	}
	if id, ok := t.(*ast.Ident); ok {
		return id.Name
	}
	return ""
}
