package kubernetes

import (
	"strconv"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// podParams are what one sandbox Pod is made from.
type podParams struct {
	key       string
	set       settings
	root      string
	runAs     string // --default-user ("" or root: none)
	volume    string // workspace PVC ("" for an emptyDir)
	labels    map[string]string
	annots    map[string]string
	readiness bool // a gRPC readiness probe (warm pool Pods)
}

// ownerLabels merges extra labels with the configured ones (reserved keys
// in extra are dropped; configured ones win).
func (p *Provider) ownerLabels(extra map[string]string) map[string]string {
	out := make(map[string]string, len(p.cfg.Labels)+len(extra)+8)
	for k, v := range extra {
		if len(k) < len(labelPrefix) || k[:len(labelPrefix)] != labelPrefix {
			out[k] = v
		}
	}
	for k, v := range p.cfg.Labels {
		out[k] = v
	}
	return out
}

// podFor is the sandbox Pod: an init container copies the token from the
// Secret into the memory-backed run directory, where the daemon reads and
// removes it; the daemon runs with few capabilities, no service-account
// token, no service links and no restarts.
func (p *Provider) podFor(pp podParams) *corev1.Pod {
	args := []string{
		"--listen", "tcp://0.0.0.0:" + strconv.Itoa(p.cfg.Port),
		"--token-file", runDir + "/" + tokenKey,
		"--workspace", pp.root,
		"--shutdown-timeout", (p.cfg.StopTimeout * 2 / 3).String(),
	}
	if pp.runAs != "" && pp.runAs != "root" {
		args = append(args, "--default-user", pp.runAs)
	}
	args = append(args, pp.set.args...)
	f, t := false, true
	grace := int64(p.cfg.StopTimeout.Seconds())
	secretMode := int32(0o400)
	caps := &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: p.cfg.Capabilities}
	sc := &corev1.SecurityContext{
		Capabilities:             caps,
		AllowPrivilegeEscalation: &f,
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	root := int64(0)
	if p.cfg.RunAsUser != nil {
		sc.RunAsUser = p.cfg.RunAsUser
		sc.RunAsGroup = p.cfg.RunAsUser
		sc.RunAsNonRoot = &t
	} else {
		sc.RunAsUser = &root
		sc.RunAsGroup = &root
	}
	// The init container only copies a file: no capabilities beyond
	// writing as its own user into the run directory.
	initSC := &corev1.SecurityContext{
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		AllowPrivilegeEscalation: &f,
		RunAsUser:                sc.RunAsUser,
		RunAsGroup:               sc.RunAsGroup,
		RunAsNonRoot:             sc.RunAsNonRoot,
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	res := corev1.ResourceRequirements{Limits: corev1.ResourceList{}, Requests: corev1.ResourceList{}}
	if pp.set.memory > 0 {
		res.Limits[corev1.ResourceMemory] = *resource.NewQuantity(pp.set.memory, resource.BinarySI)
		res.Requests[corev1.ResourceMemory] = *resource.NewQuantity(min(pp.set.memory, 64<<20), resource.BinarySI)
	}
	if pp.set.milliCPU > 0 {
		res.Limits[corev1.ResourceCPU] = *resource.NewMilliQuantity(pp.set.milliCPU, resource.DecimalSI)
		res.Requests[corev1.ResourceCPU] = *resource.NewMilliQuantity(min(pp.set.milliCPU, 50), resource.DecimalSI)
	}
	ws := corev1.Volume{Name: workspaceVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
	if pp.set.disk > 0 {
		// The kubelet evicts the Pod when its emptyDir passes sizeLimit, or
		// when the container's layer and logs plus the emptyDirs pass the
		// limit (Config.Disk).
		res.Limits[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(pp.set.disk, resource.BinarySI)
		res.Requests[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(min(pp.set.disk, 64<<20), resource.BinarySI)
		ws.EmptyDir.SizeLimit = resource.NewQuantity(pp.set.disk, resource.BinarySI)
	}
	if pp.volume != "" {
		ws.VolumeSource = corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: pp.volume}}
	}
	c := corev1.Container{
		Name:            containerName,
		Image:           pp.set.image,
		ImagePullPolicy: p.cfg.ImagePullPolicy,
		Args:            args,
		WorkingDir:      pp.root,
		Ports:           []corev1.ContainerPort{{Name: "agentd", ContainerPort: int32(p.cfg.Port), Protocol: corev1.ProtocolTCP}},
		Resources:       res,
		SecurityContext: sc,
		VolumeMounts: []corev1.VolumeMount{
			{Name: runVolume, MountPath: runDir},
			{Name: workspaceVolume, MountPath: pp.root},
		},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	if p.cfg.AgentdPath != "" {
		c.Command = []string{p.cfg.AgentdPath}
	}
	if pp.readiness {
		c.ReadinessProbe = &corev1.Probe{
			ProbeHandler:  corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: int32(p.cfg.Port)}},
			PeriodSeconds: 1, FailureThreshold: 1, SuccessThreshold: 1, TimeoutSeconds: 1,
		}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName(pp.key), Namespace: p.cfg.Namespace, Labels: pp.labels, Annotations: pp.annots},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{
				Name:            initName,
				Image:           pp.set.image,
				ImagePullPolicy: p.cfg.ImagePullPolicy,
				Command:         []string{"cp", secretMountDir + "/" + tokenKey, runDir + "/" + tokenKey},
				SecurityContext: initSC,
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{
					corev1.ResourceMemory: resource.MustParse("32Mi"), corev1.ResourceCPU: resource.MustParse("100m"),
				}},
				VolumeMounts: []corev1.VolumeMount{
					{Name: secretVolume, MountPath: secretMountDir, ReadOnly: true},
					{Name: runVolume, MountPath: runDir},
				},
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
			Containers:                    []corev1.Container{c},
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &f,
			EnableServiceLinks:            &f,
			Hostname:                      "sandbox",
			TerminationGracePeriodSeconds: &grace,
			ServiceAccountName:            p.cfg.ServiceAccountName,
			NodeSelector:                  p.cfg.NodeSelector,
			Tolerations:                   p.cfg.Tolerations,
			// seccomp RuntimeDefault is set per container, not for the
			// Pod: a Pod-level profile also applies to the sandbox (pause)
			// container, which some nodes (the test cluster's containerd on
			// cgroup v1) then fail to start.
			SecurityContext: &corev1.PodSecurityContext{},
			Volumes: []corev1.Volume{
				{Name: runVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: resource.NewQuantity(1<<20, resource.BinarySI)}}},
				{Name: secretVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
					SecretName: secretName(pp.key), DefaultMode: &secretMode,
					Items: []corev1.KeyToPath{{Key: tokenKey, Path: tokenKey}},
				}}},
				ws,
			},
		},
	}
	if p.cfg.RuntimeClassName != "" {
		rc := p.cfg.RuntimeClassName
		pod.Spec.RuntimeClassName = &rc
	}
	if p.cfg.RunAsUser != nil {
		// The secret file and the volumes are readable by the daemon's
		// group.
		pod.Spec.SecurityContext.FSGroup = p.cfg.RunAsUser
	}
	return pod
}

// ownedBy is an ownerReference to pod: garbage collection removes the
// object with it (foreground deletion waits for it).
func ownedBy(pod *corev1.Pod) []metav1.OwnerReference {
	t := true
	return []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID, BlockOwnerDeletion: &t}}
}

// secretFor is the token Secret. It is created before its Pod (the
// kubelet then mounts it at once, instead of retrying a missing Secret
// at 0.5, 1, 2 s...), so it has no owner yet: the Pod becomes its owner
// once it exists (adopt), and Reap adopts or deletes one a crash left
// unowned (ReapOrphans; its labels are the Pod's, the provider's and
// LabelKey). A cold sandbox's is immutable (its data: metadata such as
// the owner can still change); a warm pool Pod's stays mutable, because
// the claimer replaces its token with the session's (rotateClaimed).
func (p *Provider) secretFor(key, token string, labels map[string]string, mutable bool) *corev1.Secret {
	imm := !mutable
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secretName(key), Namespace: p.cfg.Namespace, Labels: labels},
		Type:       corev1.SecretTypeOpaque,
		Immutable:  &imm,
		Data:       map[string][]byte{tokenKey: []byte(token)},
	}
}

// policyFor is the sandbox's NetworkPolicy: ingress to the daemon's port
// from the harness peers only, egress per Config.Egress (none by default).
func (p *Provider) policyFor(key string, labels map[string]string) *networkingv1.NetworkPolicy {
	port := intstr.FromInt32(int32(p.cfg.Port))
	tcp := corev1.ProtocolTCP
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: policyName(key), Namespace: p.cfg.Namespace, Labels: labels},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelKey: key}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{},
			Egress:      append([]networkingv1.NetworkPolicyEgressRule{}, p.cfg.Egress...),
		},
	}
	if len(p.cfg.HarnessPeers) > 0 {
		np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{
			From:  append([]networkingv1.NetworkPolicyPeer(nil), p.cfg.HarnessPeers...),
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
		})
	}
	return np
}

// claimFor is a workspace PVC (its labels and annotations mark whose it
// is: volumeFor) of Config.VolumeSize, or of the disk cap when one is set
// (disk > 0).
func (p *Provider) claimFor(name string, labels, annots map[string]string, disk int64) *corev1.PersistentVolumeClaim {
	size := p.cfg.VolumeSize
	if disk > 0 {
		size = *resource.NewQuantity(disk, resource.BinarySI)
	}
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: p.cfg.Namespace, Labels: labels, Annotations: annots},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: p.cfg.StorageClassName,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
		},
	}
}
