# tools/sanitize.awk: reads a compute-sanitizer log; prints how many of its error records are
# NCCL's own (an API call NCCL itself made, or a fault in its kernels)
function finish() { if (inrec && nccl) n_nccl++; inrec = 0 }
{ sub(/^[^=]+=========/, "=========") }   # output of the program may lead the line
/^========= [A-Z]/ {
  finish()
  if ($0 ~ /SUMMARY|COMPUTE-SANITIZER|Target application|Saved host/) next
  inrec = 1; nccl = 0; seenat = 0; seenframe = 0
  # cudalua calls only the driver API: a failed runtime API call is NCCL's (it links the runtime)
  if ($0 ~ /on CUDA API call to cuda[A-Z]/) nccl = 1
  next
}
/^=========\s*$/ { finish(); next }
inrec && /^========= +at / && !seenat { seenat = 1; if ($0 ~ /at (nccl|_Z[0-9]*nccl)/) nccl = 1 }
inrec && /Host Frame:/ && !seenframe {
  if ($0 !~ /libcuda\.so|libcudart/) { seenframe = 1; if ($0 ~ /libnccl/) nccl = 1 }
}
END { finish(); print n_nccl + 0 }
