"""rayfabric's benchmarks: programs, not the library (the library never imports them). One module
per benchmark, each with its own main(argv), run as `rayfabric bench VARIANT ...`:

    objects    Ray vs rayfabric, object transfers side by side (`rayfabric bench` with no variant)
    link       one tc-shaped link: Ray and rayfabric next to the raw ceilings
    rails      one rail against two, on shaped links
    broadcast  one object to every node on shaped links
    tensors    tensors between actors (RDT)
    args       call arguments: Ray alone vs rayfabric.args

Shared helpers (sizes, the worker environment, sysctl reads) live in objects, the first of them."""
