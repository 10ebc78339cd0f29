// Reference measurement for bench/pprof_core.rb: builds the same profile shape as
// bench/pprof_core_bench.c with Go's github.com/google/pprof/profile library and times
// Profile.Write (gzip-compressed pprof). Built in GOPATH mode against Debian's
// golang-github-google-pprof-dev:
//   GO111MODULE=off GOPATH=/usr/share/gocode go run bench/go/pprof_write_bench.go
package main

import (
	"bytes"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/google/pprof/profile"
)

const (
	stacks    = 10000
	depth     = 64
	functions = 2000
	threads   = 16
	repeats   = 15
)

var rng uint64

// splitmix64, identical to next_random() in pprof_core_bench.c.
func nextRandom() uint64 {
	rng += 0x9e3779b97f4a7c15
	z := rng
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

func buildProfile() *profile.Profile {
	p := &profile.Profile{
		SampleType: []*profile.ValueType{
			{Type: "cpu-time", Unit: "nanoseconds"},
			{Type: "cpu-samples", Unit: "count"},
			{Type: "wall-time", Unit: "nanoseconds"},
		},
		TimeNanos:     1,
		DurationNanos: 60000000000,
	}
	funcs := make([]*profile.Function, functions)
	for f := 0; f < functions; f++ {
		name := fmt.Sprintf("App::Module%d::Class%d#method_%d", f/100, f%100, f)
		funcs[f] = &profile.Function{
			ID:         uint64(f + 1),
			Name:       name,
			SystemName: name,
			Filename:   fmt.Sprintf("/srv/app/lib/module_%d/class_%d.rb", f/100, f%100),
		}
	}
	type locationKey struct {
		function int
		line     int64
	}
	locations := map[locationKey]*profile.Location{}
	usedFunctions := map[int]bool{}
	rng = 2022
	for s := 0; s < stacks; s++ {
		sample := &profile.Sample{Location: make([]*profile.Location, depth)}
		for d := depth - 1; d >= 0; d-- { // root first, as pprof_core_bench.c does
			r := nextRandom()
			f := int(r % functions)
			line := int64(1 + (f*7)%1000 + int((r>>32)%4))
			key := locationKey{f, line}
			loc, ok := locations[key]
			if !ok {
				loc = &profile.Location{ID: uint64(len(locations) + 1), Line: []profile.Line{{Function: funcs[f], Line: line}}}
				locations[key] = loc
				p.Location = append(p.Location, loc)
				usedFunctions[f] = true
			}
			sample.Location[d] = loc
		}
		r := nextRandom()
		cpu := int64(r % 10000000)
		sample.Value = []int64{cpu, 1 + int64((r>>24)%5), cpu + int64((r>>40)%1000000)}
		sample.Label = map[string][]string{"thread name": {fmt.Sprintf("worker-%d", s%threads)}}
		if os.Getenv("PPROF_BENCH_TIMELINE") != "" { // as pprof_core_bench.c's timeline samples
			sample.NumLabel = map[string][]int64{"end_timestamp_ns": {1700000000000000000 + int64(s)*1000003}}
		}
		p.Sample = append(p.Sample, sample)
	}
	for f := 0; f < functions; f++ {
		if usedFunctions[f] {
			p.Function = append(p.Function, funcs[f])
		}
	}
	return p
}

func main() {
	p := buildProfile()
	times := make([]float64, repeats)
	var out bytes.Buffer
	for i := 0; i < repeats; i++ {
		out.Reset()
		start := time.Now()
		if err := p.Write(&out); err != nil {
			panic(err)
		}
		times[i] = float64(time.Since(start).Nanoseconds()) / 1e6
	}
	sort.Float64s(times)
	fmt.Printf("go_version=%s\n", "pprof/profile")
	fmt.Printf("serialize_ms=%.2f\n", times[repeats/2])
	fmt.Printf("serialized_bytes=%d\n", out.Len())
	fmt.Printf("samples=%d locations=%d functions=%d\n", len(p.Sample), len(p.Location), len(p.Function))
}
