#!/usr/bin/perl

# Per-client limits: a template (api_key_*) gives every API key a bucket of its own,
# created on the key's first request, summed across two nginx by two roots (one database);
# an override raises one key's limit live; a spray of random keys through a small key
# table leaves the limited keys limited; a key may hold any bytes (a binary client address),
# and its override names the bytes with %XX.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use HTTP::Tiny;
use Test::More;
use Test::Yarl qw(http_get status_of body_of);
use Time::HiRes qw(sleep);

my $http = <<'EOF2';
    yarl_roots %%ROOT_A%% %%ROOT_B%%;
    yarl_sync_interval 200ms;
    yarl_zone 8m keys=2000;
    server {
        listen 127.0.0.1:%%PORT_8080%%;
        root %%TESTDIR%%;
        location / { yarl_account api_key_$http_x_api_key; }
        location /ip/ { alias %%TESTDIR%%/; yarl_account ip_$binary_remote_addr; }
        location /h/ { alias %%TESTDIR%%/; yarl_account api_key_$http_x_api_key; yarl_headers on; }
        location = /stats { access_log off; yarl_stats; }
        location = /metrics { access_log off; yarl_metrics; }
    }
EOF2

my $t = Test::Yarl->new();
$t->run_root('A');
$t->run_root('B', '--db', 'sqlite://' . $t->testdir . '/yarl_A.db');
my $u = Test::Yarl->new()->use_roots_of($t);
my @nginx = ($t, $u);
for my $n (@nginx) {
	$n->write_file('index.html', "hello\n");
	$n->write_http_conf($http, workers => 2);
	$n->run();
}

# 3 requests per key from an empty bucket (F <= 2 passes, F >= 3 is refused), draining 1 in
# 1,000 s, the slowest a quota may drain: a limited key's fill (3 at the root) drains into
# the band between the bursts, where a request passes with probability (3 - F) / 1, by
# a thousandth per second, so the checks a few seconds in are near certain. (Not a hard cutoff at 2: a root keeps a counter at most at high_burst plus a quarter
# second of its limit and parks what an nginx claimed beyond, so the other nginx sees the
# counter just above high_burst, which a hard cutoff at the same number lets drain below.)
$t->put_quota('api_key_*', 0.001, 2, 3);
$t->put_quota('ip_*', 0.01, 0, 0);
for my $n (@nginx) {
	ok($n->wait_for(sub { ($n->stats($n->port(8080)) // {})->{zone}{templates} == 2 }, 5),
		'nginx ' . ($n == $t ? 1 : 2) . ' holds both templates');
}

# Each nginx learns from the roots how many limiters are live (new keys count for all).
for my $n (@nginx) {
	ok($n->wait_for(sub { ($n->stats($n->port(8080)) // {})->{cluster_limiters} == 2 }, 5),
		'nginx ' . ($n == $t ? 1 : 2) . ' knows of 2 live limiters');
}

my $ua = HTTP::Tiny->new(keep_alive => 1, timeout => 5);
sub get {
	my ($n, $key, $path) = @_;
	my %h = defined $key ? (headers => { 'X-Api-Key' => $key }) : ();
	return $ua->get('http://127.0.0.1:' . $n->port(8080) . ($path // '/index.html'), \%h)->{status};
}

# A key no root has reported yet counts for every live nginx (the roots say there are two):
# on nginx 1 fills 0 and 2 pass, 4 does not, where nginx 1 alone would have let 3 pass and
# both together 6. nginx 2 meets the key for the first time: its first request passes.
# (A sync round of nginx 1 between a key's three requests would make the roots report the
# key, which then no longer stands for both nginx: such a key is set aside and a fresh one
# tried, up to five times.)
my $rounds = sub { ($t->stats($t->port(8080)) // {})->{rounds} // -1 };
my %key;
for my $k (qw(k1 k2 k3 k4)) {
	for my $try (0 .. 4) {
		my $name = $try ? "$k-$try" : $k;
		my $before = $rounds->();
		my @got = map { get($t, $name) } 1 .. 3;
		if ($rounds->() != $before) {
			diag("$name: nginx 1 synced between its requests (@got), a fresh key is tried");
			next;
		}
		is($got[$_ - 1], 200, "$k: request $_ on nginx 1") for 1 .. 2;
		is($got[2], 429, "$k: the 3rd on nginx 1, a new key standing for both nginx");
		is(get($u, $name), 200, "$k: the 3rd passed on nginx 2, its first sight there");
		$key{$k} = $name;
		last;
	}
	ok(defined $key{$k}, "$k: three requests between two rounds of nginx 1");
	$key{$k} //= $k;
}
my @keys = map { $key{$_} // $_ } qw(k1 k2 k3 k4);
# A few rounds: both nginx learn every key's cluster-wide fill (3 units).
ok($t->wait_for(sub {
	for my $n (@nginx) {
		for my $k (@keys) {
			my $s = $n->stats($n->port(8080), "/stats?quota=api_key_$k") // {};
			return 0 if ((($s->{quota} // {})->{fill}) // 0) < 2.9;
		}
	}
	1;
}, 5), 'both nginx learn every key\'s cluster-wide fill');
for my $k (@keys) {
	is(get($t, $k), 429, "$k: the 4th is refused on nginx 1");
	is(get($u, $k), 429, "$k: and on nginx 2");
}
is(get($t, 'k5'), 200, 'a new key has a bucket of its own');

# The RateLimit fields name a key by its template, with the key's id (the same on every
# nginx, and nothing of the key itself) as the partition key.
my %pk;
for my $n (@nginx) {
	my $res = $ua->get('http://127.0.0.1:' . $n->port(8080) . '/h/index.html',
		{ headers => { 'X-Api-Key' => $key{k1} } });
	is($res->{status}, 429, 'k1 through the fields location');
	like($res->{headers}{'ratelimit-policy'}, qr/^"api_key_\*";q=3;w=3000;pk=:[A-Za-z0-9+\/]{11}=:$/,
		'RateLimit-Policy: the template, with pk');
	my ($p) = $res->{headers}{'ratelimit'} =~ /;pk=(:[^:]*:)/;
	like($res->{headers}{'ratelimit'}, qr/^"api_key_\*";r=0;t=\d+;pk=:/, 'RateLimit: the template, with pk');
	unlike($res->{headers}{'ratelimit'} . $res->{headers}{'ratelimit-policy'}, qr/\Q$key{k1}\E/, 'the key itself is not sent back');
	$pk{$p // ''}++;
}
is(scalar(keys %pk), 1, 'both nginx name k1 by the same pk');

# The roots count each key apart.
my ($st, $v) = $t->admin('GET', "/v1/quotas/api_key_$key{k1}");
is($st, 200, 'GET of a key');
is($v->{template}, 'api_key_*', 'names its template');
ok(($v->{counter}{fill} // 0) >= 2.9, "its counter at the root: $v->{counter}{fill}");

# An override raises one key live; the others stay where they were.
$t->put_quota("api_key_$key{k4}", 0.01, 20, 20);
my $overridden = sub {
	my $n = shift;
	my $q = ($n->stats($n->port(8080), "/stats?quota=api_key_$key{k4}") // {})->{quota};
	$q && !defined $q->{template};
};
ok($t->wait_for(sub { $overridden->($t) && $overridden->($u) }, 5), 'the override reached both nginx');
my $passed = grep { get($t, $key{k4}) == 200 } 1 .. 8;
is($passed, 8, 'k4 passes again under its override');
is(get($t, $key{k1}), 429, 'k1 is still limited');

# A key the cluster already knows, met by an nginx for the first time: its sync agent gives
# it the roots' last report of it at its next poll (10 ms), instead of the guess above until
# its next round. (A round that begins within those 10 ms takes the key first and reports it
# itself, about one time in twenty: up to three keys are tried.)
my $adopted = sub { ($u->stats($u->port(8080)) // {})->{zone}{keys_adopted} // -1 };
my ($took, $fill);
for my $c (qw(c1 c2 c3)) {
	my $before = $adopted->();
	# Two counts an interval apart: the roots report the key to nginx 2 in two rounds
	# (one report only would be a key new to the roots, which keeps the guess).
	is(get($t, $c), 200, "$c on nginx 1");
	sleep(0.5);
	is(get($t, $c), 200, "$c again on nginx 1, an interval later");
	sleep(0.5);
	is(get($u, $c), 200, "$c on nginx 2, its first sight there");
	if ($u->wait_for(sub { $adopted->() == $before + 1 }, 0.3)) {
		$took = $c;
		$fill = (($u->stats($u->port(8080), "/stats?quota=api_key_$c") // {})->{quota} // {})->{fill};
		last;
	}
}
ok(defined $took, 'nginx 2 took the roots\' report of a key it met for the first time: ' . ($took // 'none'));
# The cluster's 2 and its own 1 (the guess would be 1 standing for both nginx: 2).
ok(defined $fill && $fill > 2.9, 'and decides on the cluster\'s count: fill ' . ($fill // 'none'));
like($ua->get('http://127.0.0.1:' . $u->port(8080) . '/metrics')->{content},
	qr/^yarl_keys_adopted_total [1-9]\d*$/m, 'yarl_keys_adopted_total');

# A spray of random keys, ten times the key table, through nginx 1, at 2,500 new keys a
# second: a key's slot cannot be taken until its count has reached the roots (a round, up
# to two intervals: 1,000 keys here, half the table). Faster, the table is full of keys
# not yet synced and the new ones are refused (the template's own bucket takes them):
# unpaced, 9,300 keys a second on a fast day refused 7 %.
my $sprayed = 0;
my %sp;
my $t0 = Time::HiRes::time();
for my $i (1 .. 20000) {
	$sp{get($t, "spray-$i-" . int(rand(1e9)))}++;
	$sprayed++;
	my $ahead = $i / 2500 - (Time::HiRes::time() - $t0);
	sleep($ahead) if $ahead > 0;
}
diag(sprintf("spray took %.2f s", Time::HiRes::time() - $t0));
diag("sprayed $sprayed keys: " . join(', ', map { "$_: $sp{$_}" } sort keys %sp));
my $z = $t->stats($t->port(8080))->{zone};
diag("zone keys: $z->{keys} of $z->{key_capacity}, inserted $z->{keys_inserted}, "
	. "evicted $z->{key_evictions}, refused $z->{keys_refused}");
ok($z->{key_evictions} > 10000, 'the spray went through a full table, taking the slots of keys it left');
ok(($sp{200} // 0) > 19000, 'sprayed keys got buckets of their own: ' . ($sp{200} // 0) . ' passed');
# (The spray may take a minute on a loaded machine: the keys' fills are read, not requested,
# as a request in the band passes by chance.)
for my $k (@keys[0 .. 2]) {
	my $q = ($t->stats($t->port(8080), "/stats?quota=api_key_$k") // {})->{quota} // {};
	ok(($q->{fill} // 0) >= 2.9, "$k keeps its bucket through the spray: fill " . ($q->{fill} // 'none'));
}

# The counts per template: the spray's keys, evictions and refusals are api_key_*'s.
my %row = map { ($_->{template} // '_other') => $_ } @{ $z->{template_keys} };
is(join(',', sort keys %row), 'api_key_*,ip_*', 'yarl_stats counts both templates apart');
# (The agent's sweep may free a few drained keys between the two reads of one page.)
ok(abs($row{'api_key_*'}{keys} - $z->{keys}) < 200, "every key held is an api key: $row{'api_key_*'}{keys}");
ok(abs($row{'api_key_*'}{evictions} - $z->{key_evictions}) < 200,
	"so is every eviction: $row{'api_key_*'}{evictions}");
is($row{'api_key_*'}{refused}, $z->{keys_refused}, 'and every refusal');
# Limited keys rejected now: their rejections are the template's, one series however many
# keys (a series per key, each named by the template, was a duplicate Prometheus drops).
my $rejected = grep { get($t, $_) == 429 } map { ($_) x 2 } @keys[0 .. 2];
ok($rejected >= 2, "limited keys rejected: $rejected of 6");
my $m = $ua->get('http://127.0.0.1:' . $t->port(8080) . '/metrics')->{content};
my @rej = $m =~ /^yarl_quota_rejections_total\{quota="api_key_\*"\} (\d+)$/mg;
is(scalar @rej, 1, 'one rejection series for the template');
ok(($rej[0] // 0) >= $rejected, "counting its keys' rejections: " . ($rej[0] // 'none'));
like($m, qr/^yarl_template_keys\{template="api_key_\*"\} \d{3,4}$/m, 'yarl_metrics: keys per template');
like($m, qr/^yarl_template_key_evictions_total\{template="api_key_\*"\} \d{5}$/m, 'evictions');
like($m, qr/^yarl_template_keys\{template="_other"\} 0$/m, 'and the rest');

# A binary key: 127.0.0.1 as 4 bytes. One request passes, then its override raises it.
is(get($t, undef, '/ip/index.html'), 200, 'the client address has a bucket');
is(get($t, undef, '/ip/index.html'), 429, 'of one request');
($st, $v) = $t->admin('PUT', '/v1/quotas/ip_%257F%2500%2500%2501',
	{ limit => 0.01, low_burst => 5, high_burst => 5, parent => undef });
is($st, 200, 'an override of the binary key');
is($v->{name}, 'ip_%7F%00%00%01', 'named with %XX escapes');
# (Until then the name shows the key, with its template.)
ok($t->wait_for(sub {
	my $q = ($t->stats($t->port(8080), '/stats?quota=ip_%7F%00%00%01') // {})->{quota};
	$q && !defined $q->{template};
}, 5), 'reached nginx');
is(get($t, undef, '/ip/index.html'), 200, 'the address passes under its override');
# The keys the agent learned (thousands by now) are not quotas: the zone counts the
# quotas the roots list, also after a batch that came after the keys.
my (undef, $list) = $t->admin('GET', '/v1/quotas?limit=1000');
is($t->stats($t->port(8080))->{zone}{quotas}, scalar @{ $list->{quotas} // [] },
	'yarl_stats: the quotas, not the keys');
my ($ip) = grep { ($_->{template} // '') eq 'ip_*' } @{ $t->stats($t->port(8080))->{zone}{template_keys} };
is($ip->{keys}, 1, 'ip_* holds its one key');

# A key that spells its template (`X-Api-Key: *` makes `api_key_*`) is a key like the
# others, not the template's own bucket, which the keys that found no room share.
my $own = sub { (($t->stats($t->port(8080), '/stats?quota=api_key_*') // {})->{quota} // {})->{fill} // -1 };
my $f0 = $own->();
my @star = map { get($t, '*') } 1 .. 4;
is($star[0], 200, 'the key "*" passes');
is($star[3], 429, 'and is limited by a bucket of its own: ' . join(' ', @star));
cmp_ok(abs($own->() - $f0), '<', 0.01, "the template's own bucket is untouched ($f0)");

$t->finish();
$u->finish();
done_testing();
