"""``python -m dev demo``: the whole system on a real local plane, told as six short stories, with a final report.

It brings up the plane (etcd, kube-apiserver, kwok, the fake DRA driver, kube-scheduler, redis, the resolver webhook),
starts a dispatcher and K workers, creates fake nodes, and runs, one after another:

1. throughput: a mix of CPU and GPU pods on CPU nodes in two pools and 8-GPU nodes (pods bound and pending, pods/s,
   ledger conflicts retried, pods per worker and why a worker placed few, why pods wait);
2. gangs: a gang held with ``GangIncomplete`` until its last member exists, then bound all together; a second gang
   that cannot fit binds nothing (not even the member that would fit) and starts once the first one leaves;
3. GPU packing: the same 1/2/4-GPU pods on two identical sets of 8-GPU nodes, under the ``gpu`` policy and under
   the spreading ``default`` policy: whole GPU nodes left free and GPUs stranded, then one 8-GPU job on each;
4. pools: a tenant's pods (label ``hoss.io/pool``) land only on their pool's nodes;
5. a foreign scheduler: kube-scheduler and hoss aim pods created together at the same few small nodes; the resolver
   denies the loser's conflicting bindings (counted by the apiserver), and no node is oversold;
6. devices (DRA): pods whose ResourceClaimTemplates ask for 1 or 2 of the fake driver's GPUs, one with a CEL
   selector on the model and one with ``matchAttribute`` on the NVLink domain, get devices that keep both, each
   device in one claim only.

Each story's nodes carry a taint its pods tolerate (and a label they select), so the stories do not mix. Oversold
nodes are counted from the apiserver alone (every bound pod's requests against its node's allocatable), and so are
devices in two claims (every claim's allocation). The plane and the hoss processes keep running afterwards, for
``python -m dev status``, the dashboard and kubectl.

Modules: `dev.demo.run` (the demo from start to end), `dev.demo.stage` (its namespaces, nodes, pods and workers),
`dev.demo.observe` (what it reads back from the apiserver, the dispatcher and the resolver), one module per story
under `dev.demo.stories`, `dev.demo.report` (the report's figures) and `dev.demo.printing` (the report as text).
"""
