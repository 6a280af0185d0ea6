package main

import (
	"io"
	"slices"
	"strings"
	"testing"
)

func TestParseFlagsConfigs(t *testing.T) {
	all := slices.Clone(configNames)
	tests := []struct {
		args    []string
		want    []string
		wantErr string
	}{
		{nil, all, ""},
		{[]string{"-configs", "relay,service-gc"}, []string{"relay", "service-gc"}, ""},
		{[]string{"-configs", "all,sustained"}, append(slices.Clone(all), "sustained"), ""},
		{[]string{"-configs", "sustained"}, []string{"sustained"}, ""},
		{[]string{"-configs", "all,nope"}, nil, `unknown configuration "nope"`},
		{[]string{"-pipeline-paced-base", "shipping"}, nil, "-pipeline-paced-base"},
		{[]string{"-relay-rows", "0"}, nil, "-relay-rows"},
		{[]string{"-sustain", "500ms"}, nil, "-sustain"},
		{[]string{"-sustain-rate", "-1"}, nil, "-sustain-rate"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			o, err := parseFlags(tt.args, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one about %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(o.configs, tt.want) {
				t.Errorf("configs = %q, want %q", o.configs, tt.want)
			}
		})
	}
}

// sustained is never in all: it runs for minutes.
func TestSustainedIsNotInAll(t *testing.T) {
	for _, c := range longConfigs {
		if slices.Contains(configNames, c) {
			t.Errorf("%s is in all", c)
		}
	}
}
