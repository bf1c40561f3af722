"""The simulated Spark lab: booted Debian 12 hosts (systemd-nspawn) in network namespaces.

Real: systemd, NetworkManager, sshd, apt/dpkg, docker, Ray, the kernel's veth links and MTU.
Simulated: the GPU (nvidia-smi stand-in), the RDMA HCAs (GID tables under /sys/class/infiniband
kept in step with the interfaces' addresses), NVIDIA's apt packages, and vLLM.
"""
