# Where kvc_fwd's L2 hits come from (34.9% against cuDNN's 0.7%, session 40's ncu): L2 sectors read and hit
# by source (the SMs' tex unit, the L2 fabric between the two partitions), requests, DRAM bytes, for
# cupyflash's decode kernel and cuDNN's on 1 x 131072 dense (GQA 32/8, d128). Run from a tree's root
# with PYTHONPATH set; about 30 s.
S=$(dirname "$0")
# Regexes, so that a metric name this ncu lacks drops out instead of failing the run.
M='regex:^lts__t_(sectors|requests)_srcunit_(tex|ltcfabric).*\.sum$,dram__bytes_read.sum,gpu__time_duration.sum'
timeout 60 /usr/local/cuda/bin/ncu --metrics "$M" -k regex:kvc_fwd -c 1 python $S/decode_ncu.py flash 2>&1 | grep -E "kvc_fwd|lts__|dram__|gpu__" | grep -vE " 0$" | cut -c1-140
timeout 60 /usr/local/cuda/bin/ncu --metrics "$M" -k regex:"sdpa|fmha|cudnn" -c 1 python $S/decode_ncu.py cudnn 2>&1 | grep -E "cudnn|lts__|dram__|gpu__" | grep -vE " 0$" | cut -c1-140
