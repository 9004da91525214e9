"""rayfabric's tools: programs, not the library (the library never imports them).

    doctor     what this node's fabric can do (`rayfabric doctor`; standard library only, runs as a
               script by path too: python3 python/rayfabric/tools/doctor.py)
    demo       README's main job on a local 2-node cluster (`rayfabric demo`)
    netns      Ray nodes in network namespaces on tc-shaped links (the link, rails, broadcast benches)
    hugepages  plasma stores on huge pages for a local cluster (`rayfabric bench --huge-pages`)"""
