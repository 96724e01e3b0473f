// nri-stub-logger: an NRI plugin built on NRI's own Go plugin library (pkg/stub of
// github.com/containerd/nri, the version protos/sources.txt pins), for remora-nri's tests.
//
// It records what the runtime sends it, one line per message, in a log file, so a test can
// check that NRI's Go plugin side (socket handling, multiplexer, ttrpc, registration) works
// against remora's registry, both as an external plugin (dialing -socket-path) and launched by
// the runtime (a pre-connected socket in NRI_PLUGIN_SOCKET, its identity in NRI_PLUGIN_NAME and
// NRI_PLUGIN_IDX, its configuration in Configure).
//
// NRI's sample plugins (plugins/logger and the others) are not published as Go modules (each
// go.mod replaces github.com/containerd/nri with ../..), so they cannot be built from the Go
// module proxy; this plugin stands in for plugins/logger. scripts/setup.sh builds it into
// $REMORA_TOOLS_DIR/bin/nri-stub-logger.
//
// Flags (for an external plugin; a launched one gets no arguments):
//
//	-socket-path PATH  the runtime's NRI socket (default NRI's /var/run/nri/nri.sock)
//	-idx NN, -name N   the plugin's index and name (default: from the environment, else
//	                   from the executable's NN-name file name, as the stub does)
//	-log-file PATH     where to write the records (default: the configuration's, else stderr)
//	-events LIST       NRI's comma-separated event names to subscribe to (default: all)
//
// The configuration from Configure is JSON (which is YAML too, the format NRI's logger reads),
// with the keys NRI's logger uses: {"logFile": PATH, "events": [NAME...]}.
//
// Records (one line each, space-separated key=value, values quoted when needed):
//
//	start pid=N env=NAME,NAME... socket_env=V name_env=V idx_env=V
//	configure runtime=R version=V config="..."
//	synchronize pods=ID,ID containers=ID,ID
//	event NAME pod=ID [container=ID]
//	shutdown
//
// Records made before the log file is known (a launched plugin learns it in Configure) are
// kept and written once it is. The plugin exits 0 when its connection closes after a
// Shutdown, 1 when it closes without one.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

// recorder writes records to the log file once it is known, keeping the earlier ones.
type recorder struct {
	mu      sync.Mutex
	out     io.Writer
	pending []string
}

func (r *recorder) record(format string, args ...interface{}) {
	line := fmt.Sprintf(format, args...) + "\n"
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.out == nil {
		r.pending = append(r.pending, line)
		return
	}
	_, _ = io.WriteString(r.out, line)
}

// setOutput opens path (appending) and writes the kept records to it.
func (r *recorder) setOutput(path string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.out = f
	for _, line := range r.pending {
		_, _ = io.WriteString(f, line)
	}
	r.pending = nil
	return nil
}

// flushTo sends the kept records to w, if no log file was set.
func (r *recorder) flushTo(w io.Writer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.out == nil {
		r.out = w
		for _, line := range r.pending {
			_, _ = io.WriteString(w, line)
		}
		r.pending = nil
	}
}

type config struct {
	LogFile string   `json:"logFile"`
	Events  []string `json:"events"`
}

type plugin struct {
	rec      *recorder
	logFile  string
	mask     api.EventMask
	mu       sync.Mutex
	shutdown bool
}

func (p *plugin) Configure(_ context.Context, cfg, runtime, version string) (api.EventMask, error) {
	p.rec.record("configure runtime=%s version=%s config=%s", runtime, version, strconv.Quote(cfg))
	if strings.TrimSpace(cfg) == "" {
		p.rec.flushTo(os.Stderr)
		return p.mask, nil
	}
	var c config
	if err := json.Unmarshal([]byte(cfg), &c); err != nil {
		return 0, fmt.Errorf("parsing the configuration: %w", err)
	}
	mask := p.mask
	if len(c.Events) > 0 {
		var err error
		if mask, err = api.ParseEventMask(c.Events...); err != nil {
			return 0, fmt.Errorf("events in the configuration: %w", err)
		}
	}
	if c.LogFile != "" && c.LogFile != p.logFile {
		if err := p.rec.setOutput(c.LogFile); err != nil {
			return 0, fmt.Errorf("opening the log file: %w", err)
		}
		p.logFile = c.LogFile
	}
	p.rec.flushTo(os.Stderr)
	return mask, nil
}

func ids[T interface{ GetId() string }](objs []T) string {
	out := make([]string, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.GetId())
	}
	return strings.Join(out, ",")
}

func (p *plugin) Synchronize(_ context.Context, pods []*api.PodSandbox, ctrs []*api.Container) ([]*api.ContainerUpdate, error) {
	p.rec.record("synchronize pods=%s containers=%s", ids(pods), ids(ctrs))
	return nil, nil
}

func (p *plugin) Shutdown(context.Context) {
	p.rec.record("shutdown")
	p.mu.Lock()
	p.shutdown = true
	p.mu.Unlock()
}

func (p *plugin) pod(name string, pod *api.PodSandbox) error {
	p.rec.record("event %s pod=%s", name, pod.GetId())
	return nil
}

func (p *plugin) ctr(name string, pod *api.PodSandbox, c *api.Container) {
	p.rec.record("event %s pod=%s container=%s", name, pod.GetId(), c.GetId())
}

func (p *plugin) RunPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	return p.pod("RunPodSandbox", pod)
}

func (p *plugin) UpdatePodSandbox(_ context.Context, pod *api.PodSandbox, _, _ *api.LinuxResources) error {
	return p.pod("UpdatePodSandbox", pod)
}

func (p *plugin) PostUpdatePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	return p.pod("PostUpdatePodSandbox", pod)
}

func (p *plugin) StopPodSandbox(_ context.Context, pod *api.PodSandbox) error {
	return p.pod("StopPodSandbox", pod)
}

func (p *plugin) RemovePodSandbox(_ context.Context, pod *api.PodSandbox) error {
	return p.pod("RemovePodSandbox", pod)
}

func (p *plugin) CreateContainer(_ context.Context, pod *api.PodSandbox, c *api.Container) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	p.ctr("CreateContainer", pod, c)
	return nil, nil, nil
}

func (p *plugin) PostCreateContainer(_ context.Context, pod *api.PodSandbox, c *api.Container) error {
	p.ctr("PostCreateContainer", pod, c)
	return nil
}

func (p *plugin) StartContainer(_ context.Context, pod *api.PodSandbox, c *api.Container) error {
	p.ctr("StartContainer", pod, c)
	return nil
}

func (p *plugin) PostStartContainer(_ context.Context, pod *api.PodSandbox, c *api.Container) error {
	p.ctr("PostStartContainer", pod, c)
	return nil
}

func (p *plugin) UpdateContainer(_ context.Context, pod *api.PodSandbox, c *api.Container, _ *api.LinuxResources) ([]*api.ContainerUpdate, error) {
	p.ctr("UpdateContainer", pod, c)
	return nil, nil
}

func (p *plugin) PostUpdateContainer(_ context.Context, pod *api.PodSandbox, c *api.Container) error {
	p.ctr("PostUpdateContainer", pod, c)
	return nil
}

func (p *plugin) StopContainer(_ context.Context, pod *api.PodSandbox, c *api.Container) ([]*api.ContainerUpdate, error) {
	p.ctr("StopContainer", pod, c)
	return nil, nil
}

func (p *plugin) RemoveContainer(_ context.Context, pod *api.PodSandbox, c *api.Container) error {
	p.ctr("RemoveContainer", pod, c)
	return nil
}

// exit ends the plugin once its connection is gone: the stub calls it, and Run returns, when
// the connection closes (whichever comes first).
func (p *plugin) exit() {
	p.mu.Lock()
	shutdown := p.shutdown
	p.mu.Unlock()
	p.rec.record("closed")
	p.rec.flushTo(os.Stderr)
	if shutdown {
		os.Exit(0)
	}
	os.Exit(1)
}

func main() {
	var (
		socketPath, idx, name, logFile, events string
		opts                                   []stub.Option
	)
	flag.StringVar(&socketPath, "socket-path", "", "the runtime's NRI socket (default NRI's)")
	flag.StringVar(&idx, "idx", "", "the plugin's two-digit index")
	flag.StringVar(&name, "name", "", "the plugin's name")
	flag.StringVar(&logFile, "log-file", "", "where to write the records")
	flag.StringVar(&events, "events", "", "comma-separated NRI events to subscribe to")
	flag.Parse()

	p := &plugin{rec: &recorder{}}
	env := os.Environ()
	names := make([]string, 0, len(env))
	for _, kv := range env {
		names = append(names, strings.SplitN(kv, "=", 2)[0])
	}
	sort.Strings(names)
	p.rec.record("start pid=%d env=%s socket_env=%s name_env=%s idx_env=%s", os.Getpid(),
		strings.Join(names, ","), strconv.Quote(os.Getenv(api.PluginSocketEnvVar)),
		strconv.Quote(os.Getenv(api.PluginNameEnvVar)), strconv.Quote(os.Getenv(api.PluginIdxEnvVar)))

	if logFile != "" {
		if err := p.rec.setOutput(logFile); err != nil {
			fmt.Fprintf(os.Stderr, "nri-stub-logger: opening %s: %v\n", logFile, err)
			os.Exit(2)
		}
		p.logFile = logFile
	}
	if events != "" {
		var err error
		if p.mask, err = api.ParseEventMask(events); err != nil {
			fmt.Fprintf(os.Stderr, "nri-stub-logger: -events: %v\n", err)
			os.Exit(2)
		}
	}
	if socketPath != "" {
		opts = append(opts, stub.WithSocketPath(socketPath))
	}
	if name != "" {
		opts = append(opts, stub.WithPluginName(name))
	}
	if idx != "" {
		opts = append(opts, stub.WithPluginIdx(idx))
	}
	opts = append(opts, stub.WithOnClose(p.exit))

	s, err := stub.New(p, opts...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "nri-stub-logger: creating the stub: %v\n", err)
		os.Exit(2)
	}
	if err := s.Run(context.Background()); err != nil {
		p.rec.record("run-error %s", strconv.Quote(err.Error()))
	}
	p.exit()
}
