package deploytest

import (
	"bytes"
	"encoding/json"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/lockbench/shop/internal/config"
)

// k8sObjects is one Kustomization as kubectl apply -k would send it,
// each object decoded strictly into its k8s.io/api type.
type k8sObjects struct {
	deployments []appsv1.Deployment
	services    []corev1.Service
	configMaps  []corev1.ConfigMap
	secrets     []corev1.Secret
	pdbs        []policyv1.PodDisruptionBudget
}

// buildKustomization runs kustomize's own build (the code kubectl
// kustomize embeds) on dir, and decodes every object it emits with unknown
// fields refused: a misspelt or misplaced field fails here rather than
// being dropped by the API server's lenient decoding.
func buildKustomization(t *testing.T, dir string) k8sObjects {
	t.Helper()
	resMap, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var objs k8sObjects
	for _, r := range resMap.Resources() {
		b, err := r.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		var target any
		switch kind := r.GetKind(); kind {
		case "Deployment":
			objs.deployments = append(objs.deployments, appsv1.Deployment{})
			target = &objs.deployments[len(objs.deployments)-1]
		case "Service":
			objs.services = append(objs.services, corev1.Service{})
			target = &objs.services[len(objs.services)-1]
		case "ConfigMap":
			objs.configMaps = append(objs.configMaps, corev1.ConfigMap{})
			target = &objs.configMaps[len(objs.configMaps)-1]
		case "Secret":
			objs.secrets = append(objs.secrets, corev1.Secret{})
			target = &objs.secrets[len(objs.secrets)-1]
		case "PodDisruptionBudget":
			objs.pdbs = append(objs.pdbs, policyv1.PodDisruptionBudget{})
			target = &objs.pdbs[len(objs.pdbs)-1]
		default:
			t.Fatalf("%s: a %s, which this test does not check: add it here", dir, kind)
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(target); err != nil {
			t.Fatalf("%s: %s %s: %v", dir, r.GetKind(), r.GetName(), err)
		}
	}
	if len(objs.deployments) != 1 || len(objs.configMaps) != 1 || len(objs.secrets) != 1 ||
		len(objs.services) != 1 || len(objs.pdbs) != 1 {
		t.Fatalf("%s: want one Deployment, ConfigMap, Secret, Service and PodDisruptionBudget", dir)
	}
	return objs
}

// env is what the shop container sees: the ConfigMap and the Secret its
// envFrom names (kustomize has added their hash suffixes to both).
func (o k8sObjects) env(t *testing.T) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, from := range o.deployments[0].Spec.Template.Spec.Containers[0].EnvFrom {
		switch {
		case from.ConfigMapRef != nil && from.ConfigMapRef.Name == o.configMaps[0].Name:
			for k, v := range o.configMaps[0].Data {
				env[k] = v
			}
		case from.SecretRef != nil && from.SecretRef.Name == o.secrets[0].Name:
			for k, v := range o.secrets[0].Data {
				env[k] = string(v)
			}
		default:
			t.Errorf("envFrom %+v names neither the ConfigMap %s nor the Secret %s", from, o.configMaps[0].Name, o.secrets[0].Name)
		}
	}
	return env
}

func TestKubernetesBase(t *testing.T) {
	o := buildKustomization(t, filepath.Join(repoRoot(t), "deploy", "k8s", "base"))
	d := o.deployments[0]
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 3 {
		t.Errorf("replicas = %v, want 3", d.Spec.Replicas)
	}
	env := o.env(t)
	// The example Secret holds the public dev secrets, never real values,
	// and production refuses them: the base cannot run on them by mistake.
	if env["SHOP_JWT_SECRET"] != config.DevJWTSecret || env["SHOP_ADMIN_TOKEN"] != config.DevAdminToken {
		t.Errorf("the example Secret holds values other than the public dev secrets")
	}
	if _, err := config.Load(mapEnv(env)); err == nil || !strings.Contains(err.Error(), "SHOP_JWT_SECRET") {
		t.Errorf("production on the example Secret: config.Load = %v, want the dev secrets refused", err)
	}
	env["SHOP_JWT_SECRET"], env["SHOP_ADMIN_TOKEN"] = strings.Repeat("j", 32), strings.Repeat("a", 32)
	checkShopWorkload(t, o, env)
}

func TestKubernetesDevOverlay(t *testing.T) {
	o := buildKustomization(t, filepath.Join(repoRoot(t), "deploy", "k8s", "dev"))
	env := o.env(t)
	if env["SHOP_ENV"] != config.EnvDev {
		t.Errorf("the dev overlay runs SHOP_ENV=%q", env["SHOP_ENV"])
	}
	checkShopWorkload(t, o, env)
}

func mapEnv(env map[string]string) func(string) string {
	return func(k string) string { return env[k] }
}

// checkShopWorkload checks what both the base and its overlays must keep:
// the configuration loads, the probes and ports reach shop's routes and
// listeners, the grace period covers the drain, the pod is locked down, and
// the Service and the budget select its pods.
func checkShopWorkload(t *testing.T, o k8sObjects, env map[string]string) {
	t.Helper()
	read := map[string]bool{}
	_, _ = config.Load(func(name string) string { read[name] = true; return "" })
	for name := range env {
		if !read[name] {
			t.Errorf("the pod's environment sets %s, which internal/config does not read", name)
		}
	}
	cfg, err := config.Load(mapEnv(env))
	if err != nil {
		t.Fatalf("the pod's environment does not load: %v", err)
	}
	pod := o.deployments[0].Spec.Template
	checkContainer(t, pod.Spec.Containers, cfg)
	checkGracePeriod(t, pod.Spec.TerminationGracePeriodSeconds, cfg)
	checkPodSecurity(t, pod.Spec)
	if got := pod.Annotations["prometheus.io/port"]; got != strconv.Itoa(addrPort(t, cfg.MetricsAddr)) {
		t.Errorf("prometheus.io/port = %q, shop serves /metrics on %s", got, cfg.MetricsAddr)
	}
	if host, _, _ := net.SplitHostPort(cfg.MetricsAddr); cfg.MetricsOnHTTPAddr() || loopbackHost(host) {
		t.Errorf("SHOP_METRICS_ADDR %q: want a port of its own, not the public API port, on an interface Prometheus reaches", cfg.MetricsAddr)
	}
	for name, sel := range map[string]map[string]string{
		"Service " + o.services[0].Name:                o.services[0].Spec.Selector,
		"PodDisruptionBudget " + o.pdbs[0].Name:        o.pdbs[0].Spec.Selector.MatchLabels,
		"Deployment selector " + o.deployments[0].Name: o.deployments[0].Spec.Selector.MatchLabels,
	} {
		if len(sel) == 0 || !selects(sel, pod.Labels) {
			t.Errorf("%s selects %v, not the pods (labels %v)", name, sel, pod.Labels)
		}
	}
	for _, p := range o.services[0].Spec.Ports {
		if !slices.ContainsFunc(pod.Spec.Containers[0].Ports, func(c corev1.ContainerPort) bool { return c.Name == p.TargetPort.StrVal }) {
			t.Errorf("Service port %s targets %q, which the container does not name", p.Name, p.TargetPort.String())
		}
	}
}

// checkContainer: the image is the Dockerfile's, run through its
// ENTRYPOINT; the probes ask real routes on the port shop listens on.
func checkContainer(t *testing.T, containers []corev1.Container, cfg config.Config) {
	t.Helper()
	if len(containers) != 1 {
		t.Fatalf("%d containers, want shop alone", len(containers))
	}
	c := containers[0]
	repo, tag, _ := strings.Cut(c.Image, ":")
	if want, _, _ := strings.Cut(shopImage, ":"); repo != want || tag == "" {
		t.Errorf("image %q, want %s:<tag>, what make image builds from the Dockerfile", c.Image, want)
	}
	if len(c.Command) > 0 || !slices.Equal(c.Args, []string{"serve"}) {
		t.Errorf("command %v args %v: want the image's ENTRYPOINT (%s) with args [serve]", c.Command, c.Args, dockerfileBinary(t))
	}
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	if ports["http"] != int32(addrPort(t, cfg.HTTPAddr)) || ports["metrics"] != int32(addrPort(t, cfg.MetricsAddr)) {
		t.Errorf("container ports %v; shop listens on %s and %s", ports, cfg.HTTPAddr, cfg.MetricsAddr)
	}
	checkProbes(t, c, ports)
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v: want CPU and memory requests and a memory limit", c.Resources)
	}
}

// checkProbes: the readiness and liveness probes ask their routes of
// openapi.yaml on the http port, among the container's named ports.
func checkProbes(t *testing.T, c corev1.Container, ports map[string]int32) {
	t.Helper()
	routes := openAPIPaths(t)
	for name, probe := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		want := map[string]string{"readiness": "/readyz", "liveness": "/healthz"}[name]
		if probe == nil || probe.HTTPGet == nil {
			t.Errorf("no HTTP %s probe", name)
			continue
		}
		if g := probe.HTTPGet; g.Path != want || !routes[g.Path] || ports[g.Port.StrVal] != ports["http"] {
			t.Errorf("%s probe GET %s on port %q; want %s, a route of openapi.yaml, on the http port", name, g.Path, g.Port.String(), want)
		}
	}
}

// checkGracePeriod: the kubelet's SIGKILL comes after the grace period;
// before it, shop fails readiness for the drain delay, gives in-flight
// requests the shutdown timeout, and the cancelled ones 5 s (cmd/shop's
// cancelGrace) to return.
func checkGracePeriod(t *testing.T, grace *int64, cfg config.Config) {
	t.Helper()
	const cancelGrace = 5 * time.Second
	need := cfg.DrainDelay + cfg.ShutdownTimeout + cancelGrace
	if grace == nil {
		t.Fatal("no terminationGracePeriodSeconds")
	}
	if time.Duration(*grace)*time.Second <= need {
		t.Errorf("terminationGracePeriodSeconds = %d; drain %s + shutdown %s + %s for cancelled handlers need more",
			*grace, cfg.DrainDelay, cfg.ShutdownTimeout, cancelGrace)
	}
}

func checkPodSecurity(t *testing.T, spec corev1.PodSpec) {
	t.Helper()
	p, c := spec.SecurityContext, spec.Containers[0].SecurityContext
	if p == nil || p.RunAsNonRoot == nil || !*p.RunAsNonRoot || p.RunAsUser == nil || *p.RunAsUser == 0 {
		t.Errorf("pod securityContext %+v: want runAsNonRoot and a non-zero runAsUser", p)
	}
	if c == nil || c.ReadOnlyRootFilesystem == nil || !*c.ReadOnlyRootFilesystem ||
		c.AllowPrivilegeEscalation == nil || *c.AllowPrivilegeEscalation ||
		c.Capabilities == nil || !slices.Equal(c.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("container securityContext %+v: want a read-only root, no privilege escalation, every capability dropped", c)
	}
}

func selects(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func addrPort(t *testing.T, addr string) int {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	n, err2 := strconv.Atoi(port)
	if err != nil || err2 != nil {
		t.Fatalf("address %q has no port", addr)
	}
	return n
}

// openAPIPaths are the paths of internal/apidoc/openapi.yaml; cmd/shop's
// tests check that the router serves every one of them.
func openAPIPaths(t *testing.T) map[string]bool {
	t.Helper()
	var doc struct {
		Paths map[string]any `yaml:"paths"`
	}
	unmarshalYAML(t, filepath.Join(repoRoot(t), "internal", "apidoc", "openapi.yaml"), &doc)
	paths := map[string]bool{}
	for p := range doc.Paths {
		paths[p] = true
	}
	return paths
}
