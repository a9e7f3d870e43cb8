# usage: variant.sh NAME (edits the op's do_not_specialize lists in place, on the device copy)
f=native/block_diffusion_attention/block_diffusion_attention.py
case $1 in
  base) ;;
  all) sed -i -E 's/@(triton|gluon)\.jit\(do_not_specialize=[^)]*\)/@\1.jit/' $f ;;
  seq) sed -i -E 's/_SIZES = \[.*\]/_SIZES = ["H", "GROUP", "Mt", "Nt", "PER_BATCH"]/; s/do_not_specialize=\["H", "Sq"\]/do_not_specialize=["H"]/; s/, "Sq", "Sk", "Mt"/, "Mt"/' $f ;;
  seqh) sed -i -E 's/_SIZES = \[.*\]/_SIZES = ["GROUP", "Mt", "Nt", "PER_BATCH"]/; s/do_not_specialize=\[\*_SIZES, "HK"\]/do_not_specialize=_SIZES/; s/do_not_specialize=\["H", "Sq"\]/do_not_specialize=[]/; s/"H", "HK", "GROUP", "Sq", "Sk", "Mt"/"GROUP", "Mt"/; s/"H", "GROUP", "HK", "Sq", "Sk", "Mt"/"GROUP", "Mt"/' $f ;;
esac
grep -n "do_not_specialize\|^_SIZES" $f
