#!/usr/bin/perl

# Sharded roots: two roots, each aggregating one shard of the counters (--shard 0/2 and
# 1/2, one quota database), and an nginx with one yarl_roots line per shard. A request
# accounted on a child quota adds to the child's counter at the root of the child's shard
# and to its parent's at the root of the parent's shard, and to nothing anywhere else;
# both roots serve every quota. nginx -t refuses shard maps with a gap or a mix.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of);
use Time::HiRes qw(sleep);

my $t = Test::Yarl->new();
$t->write_file('index.html', "hello\n");

sub conf {
	my ($roots) = @_;
	$t->write_http_conf(<<"EOF2");
    $roots
    yarl_sync_interval 100ms;
    server {
        listen 127.0.0.1:%%PORT_8080%%;
        root %%TESTDIR%%;
        location / {
            yarl_account child;
        }
        location = /stats {
            yarl_stats;
        }
    }
EOF2
}

# nginx -t: every shard needs its line, and lines are all sharded or one unsharded.
for my $case (
	['yarl_roots http://127.0.0.1:1 shard=1/2;', qr/no "yarl_roots \.\.\. shard=0\/2" line/],
	["yarl_roots http://127.0.0.1:1 shard=0/2;\n    yarl_roots http://127.0.0.1:2;", qr/must all have shard=INDEX\/COUNT/],
	["yarl_roots http://127.0.0.1:1 shard=0/2;\n    yarl_roots http://127.0.0.1:2 shard=1/3;", qr/does not match shard=0\/2/],
	['yarl_roots http://127.0.0.1:1 shard=2/2;', qr/invalid value "shard=2\/2" in "yarl_roots" directive/],
	['yarl_roots shard=0/1;', qr/the shard has no roots/],
) {
	conf($case->[0]);
	my ($rc, $out) = $t->test_config();
	isnt($rc, 0, "nginx -t refuses: $case->[0]");
	like($out, $case->[1], 'and says why');
}

my $db = 'sqlite://' . $t->testdir . '/shared.db';
$t->run_root('S0', '--db', $db, '--shard', '0/2');
$t->run_root('S1', '--db', $db, '--shard', '1/2');
conf("yarl_roots %%ROOT_S0%% shard=0/2;\n    yarl_roots %%ROOT_S1%% shard=1/2;");
my ($rc, $out) = $t->test_config();
is($rc, 0, 'nginx -t accepts one line per shard') or diag($out);
$t->run();

# Ids 1 and 2 are on different shards of two: the parent (1) on shard 1, the child (2) on 0.
$t->put_quota('parent', 1, 100, 200, undef, 'S0');
$t->put_quota('child', 1, 100, 200, 'parent', 'S0');
ok($t->wait_quota($t->port(8080), 'child', 10), 'quotas arrive (from either root)');
ok($t->wait_quota($t->port(8080), 'parent', 10), 'the parent too');
# S1 reads them from the shared database at its next poll (1 s): a delta reaching a root
# before it knows the quota is dropped as unknown, so the traffic waits for both.
ok($t->wait_for(sub {
	!grep { ($t->root_metrics($_)->{yarl_root_quotas} // 0) < 2 } qw(S0 S1)
}, 10), 'both roots hold both quotas');

my $passed = grep { status_of(http_get($t->port(8080), '/index.html')) == 200 } 1 .. 20;
is($passed, 20, 'requests pass');

sub fill {
	my ($root, $name) = @_;
	my ($s, $b) = $t->admin('GET', "/v1/quotas/$name", undef, $root);
	return ref $b ? $b->{counter}{fill} : -1;
}
ok($t->wait_for(sub { fill('S0', 'child') > 15 && fill('S1', 'parent') > 15 }, 5),
	'each counter is summed at its shard\'s root: child ' . fill('S0', 'child')
	. ' at shard 0, parent ' . fill('S1', 'parent') . ' at shard 1');
is(fill('S1', 'child'), 0, 'the child is not counted at the other shard');
is(fill('S0', 'parent'), 0, 'nor the parent');

my $s = $t->stats($t->port(8080));
is(scalar @{$s->{roots}}, 2, 'the agent syncs with both roots');
ok((grep { $_->{ok} } @{$s->{roots}}) == 2, 'both answer') or diag(explain($s->{roots}));
my $m = $t->root_metrics('S0');
is($m->{yarl_root_deltas_foreign_total}, 0, 'no delta reached the wrong shard');

$t->finish();
done_testing();
