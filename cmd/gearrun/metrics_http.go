package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// serveMetrics serves the figures of job's ranks, tables and shards at addr
// in Prometheus's text exposition format (on any path; /metrics by
// convention). A bare ":port" listens on loopback only. The caller closes
// the server.
func serveMetrics(addr string, job jobRef) (*http.Server, error) {
	if strings.HasPrefix(addr, ":") {
		addr = "127.0.0.1" + addr
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr %s: %w", addr, err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r, err := readJob(job)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		writeProm(w, topFrameOf(job.id, r, r))
	})}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = ln.Close()
		}
	}()
	return srv, nil
}

// promFamily is one metric family of the exposition.
type promFamily struct {
	name, help, typ string
	samples         []promSample
}

type promSample struct {
	labels [][2]string
	value  float64
}

// writeProm writes f's totals (the Prometheus server computes rates) in the
// text exposition format, version 0.0.4.
func writeProm(w io.Writer, f topFrame) {
	fams := map[string]*promFamily{}
	add := func(name, typ, help string, v float64, labels ...string) {
		fam := fams[name]
		if fam == nil {
			fam = &promFamily{name: name, help: help, typ: typ}
			fams[name] = fam
		}
		s := promSample{labels: [][2]string{{"job_id", f.Job}}, value: v}
		for i := 0; i+1 < len(labels); i += 2 {
			s.labels = append(s.labels, [2]string{labels[i], labels[i+1]})
		}
		fam.samples = append(fam.samples, s)
	}
	for _, r := range f.Ranks {
		rk := strconv.Itoa(r.Rank)
		up := 0.0
		if r.Running {
			up = 1
		}
		add("gear_rank_up", "gauge", "1 while the rank's process runs.", up, "rank", rk, "role", r.Role)
		add("gear_rank_generation", "gauge", "The world's generation (restarts before it).", float64(r.Generation), "rank", rk)
		for _, o := range r.Ops {
			add("gear_collective_calls_total", "counter", "Collective calls, by operation.", float64(o.Calls), "rank", rk, "op", o.Op)
			add("gear_collective_bytes_total", "counter", "Bytes of this rank's buffers in collective calls.", float64(o.Bytes), "rank", rk, "op", o.Op)
			add("gear_collective_seconds_total", "counter", "Time in collective calls (one call in 16 timed, scaled).", o.Seconds, "rank", rk, "op", o.Op)
		}
	}
	for _, t := range f.Tables {
		rk := strconv.Itoa(t.Rank)
		add("gear_table_size", "gauge", "Items in the table.", float64(t.Size), "rank", rk, "table", t.Name)
		add("gear_table_max_size", "gauge", "The table's max size.", float64(t.MaxSize), "rank", rk, "table", t.Name)
		add("gear_table_inserts_total", "counter", "Items inserted.", float64(t.Inserts), "rank", rk, "table", t.Name)
		add("gear_table_samples_total", "counter", "Items sampled.", float64(t.Samples), "rank", rk, "table", t.Name)
		add("gear_table_rate_limited_seconds_total", "counter", "Time calls spent blocked by the rate limiter, by call.", t.InsertWaitSeconds, "rank", rk, "table", t.Name, "call", "insert")
		add("gear_table_rate_limited_seconds_total", "counter", "", t.SampleWaitSeconds, "rank", rk, "table", t.Name, "call", "sample")
	}
	for _, s := range f.Shards {
		if s.Error != "" {
			continue
		}
		rk := strconv.Itoa(s.Rank)
		for _, st := range []struct {
			state string
			n     int
		}{{"free", s.Free}, {"reserved", s.Reserved}, {"writing", s.Writing}, {"committed", s.Committed}, {"pinned", s.Pinned}, {"doomed", s.Doomed}} {
			add("gear_shard_rows", "gauge", "Rows of the store shard, by state (reserved rows are free rows in writers' chunks; pinned rows are committed).", float64(st.n), "rank", rk, "shard", s.Name, "state", st.state)
		}
		add("gear_shard_writers", "gauge", "Processes attached to the shard as writers.", float64(s.Writers), "rank", rk, "shard", s.Name)
	}
	names := make([]string, 0, len(fams))
	for n := range fams {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		fam := fams[n]
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", n, escapeHelp(fam.help), n, fam.typ)
		for _, s := range fam.samples {
			b.WriteString(n)
			b.WriteByte('{')
			for i, l := range s.labels {
				if i > 0 {
					b.WriteByte(',')
				}
				fmt.Fprintf(&b, "%s=\"%s\"", l[0], escapeLabel(l[1]))
			}
			b.WriteString("} ")
			b.WriteString(strconv.FormatFloat(s.value, 'g', -1, 64))
			b.WriteByte('\n')
		}
	}
	io.WriteString(w, b.String())
}

var (
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
)

func escapeHelp(s string) string  { return helpEscaper.Replace(s) }
func escapeLabel(s string) string { return labelEscaper.Replace(s) }
