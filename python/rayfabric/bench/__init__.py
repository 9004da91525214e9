"""rayfabric's benchmarks: programs, not the library (the library never imports them). One module
per benchmark, each with its own main(argv):

    objects    Ray vs rayfabric, object transfers side by side (`rayfabric bench`)
    link       one tc-shaped link: Ray and rayfabric next to the raw ceilings (`bench --link`)
    rails      one rail against two, on shaped links (`bench --rails`)
    broadcast  one object to every node on shaped links (`bench --broadcast`)
    tensors    tensors between actors (RDT) (`bench --tensors`)
    args       call arguments: Ray alone vs rayfabric.args (`bench-args`)

Shared helpers (sizes, the worker environment, sysctl reads) live in objects, the first of them."""
